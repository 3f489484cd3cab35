#!/usr/bin/env bash
# Everything the GPU is needed for, in one device call (see benchmarks/README.md):
# the generated kernels against the reference on CUDA, bfloat16, the command line on
# cuda, then the aggregation micro-benchmark. Training-step benchmarks take longer and
# run separately (bench_training.py, one or two data sets per call).
#
#   GNNFUSE_COMMIT=<commit sent> GNNFUSE_DATA=<carried data folder> bash benchmarks/gpu_check.sh OUT
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
status=0
step() { echo "== $*"; "$@" || { echo "!! failed: $*"; status=1; }; }
# addopts cleared (its -n auto would start a worker per core): one process, the tests share one GPU
step python -m pytest -q -x -p no:cacheprovider -o addopts="" tests/test_triton_backend.py tests/test_nn.py
step python benchmarks/check_bf16.py
step python -m gnnfuse train --model gat --dataset cora --device cuda --epochs 30
step python -m gnnfuse bench --model gat --dataset cora --device cuda --steps 5 --json "$out/bench_gat_cora.json"
step python -m gnnfuse explain --model gat --dataset cora --device cuda --dot "$out/gat.dot"
step python benchmarks/bench_aggregate.py --dataset arxiv-like --out benchmarks/results
cp benchmarks/results/aggregate.* "$out"/ 2>/dev/null
exit $status
