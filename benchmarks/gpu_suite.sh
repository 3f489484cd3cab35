#!/usr/bin/env bash
# The whole test suite on the GPU machine: real Triton kernels, autotuned, where CI runs one
# fixed config per kernel in Triton's interpreter. Differences the interpreter cannot show
# (each kernel's own tile shape and so its own summation order; CUDA's unspecified choice
# among duplicate indices) surfaced only here (2026-11-30: a max's gradient came out
# infinite). A shard is every k-th test file, so each fits one device call (with the config
# check below, the three shards took 336, 464 and 251 s on an H200, 2026-12-02; half the
# files took 460-577 s without it):
#
#   bash benchmarks/gpu_suite.sh OUT 1/3      then, in the next calls,      ... OUT 2/3   ... OUT 3/3
#
# The real-data tests (Cora models, the CLI, downloads) need ../shared/data, which does not
# travel to the GPU machine: copy it into a git-ignored folder of the checkout, carry that
# folder, and set GNNFUSE_DATA to it for this script (tests/conftest.py's `shared_data`).
#
# CHECK_CONFIGS=1 (the default) runs every autotuning config of each tuned kernel on its first
# launch and fails on one that writes other values than the first
# (src/gnnfuse/backend/triton/config_check.py): a miscompiled config then fails every run,
# not only the runs where the timing picks it. CHECK_CONFIGS=0 tests the picked ones only.
#
# 14 workers share the GPU (addopts' -n auto would start one per core). Stopped with SIGINT
# at LIMIT seconds, pytest still prints what failed so far and which tests ran (-v).
set -uo pipefail
out=${1:?usage: gpu_suite.sh OUT_DIR [SHARD/SHARDS]}
shard=${2:-1/1}
index=${shard%/*} count=${shard#*/}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 GNNFUSE_CHECK_CONFIGS=${CHECK_CONFIGS:-1}
files=$(ls tests/test_*.py | sort | awk -v i="$index" -v n="$count" '(NR - 1) % n == i - 1')
log="$out/tests_${index}_of_${count}.log"
timeout -s INT -k 30 "${LIMIT:-540}" python -m pytest -o addopts="" -n "${WORKERS:-14}" --dist worksteal -v \
    -p no:cacheprovider -p no:benchmark -rfEs --tb=short --durations=20 $files > "$log" 2>&1
status=$?
grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed)" "$log" | tail -40
exit $status
