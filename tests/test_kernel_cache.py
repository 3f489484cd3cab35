"""The on-disk kernel cache under concurrent writers (several training ranks compile the
same kernels at once)."""
from __future__ import annotations

import hashlib

import pytest

from gnnfuse.backend import kernel_cache


def test_a_kernel_file_another_process_is_still_writing_is_not_imported_half_written(tmp_path, monkeypatch):
    """A second rank found the file of the first rank's ``write_text`` created but still
    empty and imported it: ``AttributeError: module ... has no attribute``."""
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    source = "def kernel_under_test():\n    return 42\n"
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    (kernel_cache.cache_dir() / f"kernel_under_test_{digest}.py").write_text("")   # mid-write
    assert kernel_cache.load_kernel(source, "kernel_under_test")() == 42


def test_a_damaged_kernel_file_that_is_not_utf8_is_rewritten(tmp_path, monkeypatch):
    """A kernel file holding bytes that are not UTF-8 (a disk error, a crash mid-copy)
    raised a raw ``UnicodeDecodeError`` from the cache's comparison with the source."""
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    source = "def damaged_kernel_under_test():\n    return 7\n"
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    (kernel_cache.cache_dir() / f"damaged_kernel_under_test_{digest}.py").write_bytes(b"\xff\xfe\x00junk")
    assert kernel_cache.load_kernel(source, "damaged_kernel_under_test")() == 7


def test_a_cache_folder_that_cannot_be_made_names_the_variable(tmp_path, monkeypatch):
    """$GNNFUSE_CACHE naming a file gave a bare ``NotADirectoryError`` on a path inside it."""
    import pytest
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("GNNFUSE_CACHE", str(blocker))
    with pytest.raises(kernel_cache.KernelCacheError, match=r"GNNFUSE_CACHE.*a_file"):
        kernel_cache.load_kernel("def unwritable_kernel():\n    return 1\n", "unwritable_kernel")


def test_a_leading_tilde_in_the_cache_variables_is_the_home_folder(tmp_path, monkeypatch):
    """``GNNFUSE_CACHE="~/c"`` (quoted: the shell leaves ~ alone) made a folder named ``~``
    in the working directory, as ``$GNNFUSE_DATA`` no longer does."""
    from gnnfuse.backend import tuned_schedule
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GNNFUSE_CACHE", "~/c")
    monkeypatch.delenv(tuned_schedule.PATH_ENV, raising=False)
    assert kernel_cache.cache_dir() == tmp_path / "c" / "kernels"
    assert tuned_schedule.cache_path() == tmp_path / "c" / "tuned_schedules.json"
    monkeypatch.setenv(tuned_schedule.PATH_ENV, "~/t.json")
    assert tuned_schedule.cache_path() == tmp_path / "t.json"
    assert not (tmp_path / "~").exists()


# One process of `test_two_processes_compiling_one_kernel_for_different_dtypes_keep_numba_s_cache_consistent`:
# compiles the kernel for its dtype with Numba's cache save forced into the interleaving that
# paired one signature's index entry with the other's machine code (files in argv[3] signal).
_RACING_COMPILE = r'''
import sys, time
from pathlib import Path
import numpy as np
import numba.core.caching as caching
from gnnfuse.backend import kernel_cache

role, dtype, signals, target = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
def signal(name):
    (signals / name).touch()
def wait(name, limit=None):      # limit: a wait the cross-process lock makes impossible
    start = time.monotonic()
    while not (signals / name).exists() and (limit is None or time.monotonic() - start < limit):
        time.sleep(0.02)
save_overload = caching.Cache.save_overload
save, load_index = caching.IndexDataCacheFile.save, caching.IndexDataCacheFile._load_index
save_index, save_data = caching.IndexDataCacheFile._save_index, caching.IndexDataCacheFile._save_data
saving = []
def patched_save_overload(self, sig, data):      # B's save starts once A's has read the index
    if role == "B":
        wait("A_loaded")
    save_overload(self, sig, data)
def patched_save(self, key, data):
    saving.append(True)
    save(self, key, data)
def patched_load_index(self):
    overloads = load_index(self)
    if saving:
        signal(f"{role}_loaded")
        if role == "A":
            wait("B_loaded", limit=2)
    return overloads
def patched_save_index(self, overloads):
    if role == "B":
        wait("A_index", limit=2)
    save_index(self, overloads)
    signal(f"{role}_index")
def patched_save_data(self, name, data):
    if role == "A":
        wait("B_data", limit=2)
    save_data(self, name, data)
    signal(f"{role}_data")
if role in ("A", "B"):
    caching.Cache.save_overload = patched_save_overload
    caching.IndexDataCacheFile.save = patched_save
    caching.IndexDataCacheFile._load_index = patched_load_index
    caching.IndexDataCacheFile._save_index = patched_save_index
    caching.IndexDataCacheFile._save_data = patched_save_data
x = np.arange(5, dtype=dtype)
out = np.zeros(5, dtype=dtype)
if target == "generated":
    source = ("import numba\n@numba.njit(cache=True)\ndef racing_kernel(x, out):\n"
              "    for i in range(x.shape[0]):\n        out[i] = x[i] * 2\n")
    kernel_cache.load_kernel(source, "racing_kernel")(x, out)
else:    # dropout's mask, every element kept (threshold 0), scaled by 2
    from gnnfuse.backend.cpu.random_mask import _masked_scale
    _masked_scale(x, out, np.uint64(1), np.uint64(0), x.dtype.type(2.0))
print(out.tolist())
'''


# the dropout mask's guard is the same call (random_mask.py); its race costs 20 s more to run
@pytest.mark.parametrize("target", ["generated"])
def test_two_processes_compiling_one_kernel_for_different_dtypes_keep_numba_s_cache_consistent(target, tmp_path):
    """Numba saves a new signature's machine code by reading its index, picking the first
    free data file, then writing the index and the data file, unlocked. Two processes
    compiling one cached kernel for float32 and float64 at once both picked ``1.nbc``:
    the index kept the float64 entry, the data file the float32 code, and every later
    float64 process loaded float32 code and failed deep inside Numba ("can't unbox array
    from PyObject into native value") until the cache folder was deleted. So for a
    generated kernel, and for the CPU backend's dropout mask (in the package's cache)."""
    import os
    import subprocess
    import sys
    script = tmp_path / "racing_compile.py"
    script.write_text(_RACING_COMPILE)
    signals = tmp_path / "signals"
    signals.mkdir()
    env = {**os.environ, "GNNFUSE_CACHE": str(tmp_path / "cache"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}

    def start(role: str, dtype: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), role, dtype, str(signals), target], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    racing = [start("A", "float32"), start("B", "float64")]
    readers = []
    try:
        for process in racing:
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-2000:]
    finally:
        for process in racing:
            process.kill()
    for dtype in ("float64", "float32"):       # later processes: load the machine code from the cache
        reader = start("reader", dtype)
        out, err = reader.communicate(timeout=300)
        readers.append((reader.returncode, out.strip(), err[-2000:]))
    assert readers == [(0, "[0.0, 2.0, 4.0, 6.0, 8.0]", readers[0][2]), (0, "[0.0, 2.0, 4.0, 6.0, 8.0]", readers[1][2])]


_CACHED_KERNELS = {
    "generated": ("cached_kernel", "import numpy as np\nfrom gnnfuse.backend import kernel_cache\n"
                  "source = 'import numba\\n@numba.njit(cache=True)\\n'\n"
                  "source += 'def cached_kernel(x):\\n    return x.sum() * 2\\n'\n"
                  "print(kernel_cache.load_kernel(source, 'cached_kernel')(np.arange(4.0)))\n", "12.0"),
    "sampler": ("hop_numba.sample", "import numpy as np\nfrom gnnfuse.loader import hop_numba\n"
                "z = lambda: np.zeros(2, dtype=np.int64)\nsrc, eid, count = z(), z(), z()\n"
                "a = lambda *v: np.array(v, dtype=np.int64)\n"
                "hop_numba.sample(a(0, 1, 2), a(1, 0), a(0, 1), 1, 0, src, eid, count, 2)\n"
                "print(src.tolist())\n", "[1, 0]"),
}


# the index of one kernel and the data file of the other: one guard class serves both (14 s a case)
@pytest.mark.parametrize(("kernel", "damaged"), [("generated", "nbi"), ("sampler", "nbc")])
def test_a_truncated_numba_cache_file_is_compiled_over_with_a_warning_naming_it(kernel, damaged, tmp_path):
    """A truncated Numba index or data file of a generated kernel or the loader's sampler
    (a disk error, a copy stopped midway) made every later process fail inside Numba
    with ``UnpicklingError: pickle data was truncated``, naming no file."""
    import os
    import subprocess
    import sys
    prefix, code, expected = _CACHED_KERNELS[kernel]
    script = tmp_path / "cached_kernel.py"
    script.write_text(code)
    env = {**os.environ, "GNNFUSE_CACHE": str(tmp_path / "cache"), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "PYTHONWARNINGS": "always"}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run().stdout.strip() == expected
    (file,) = (tmp_path / "numba").rglob(f"{prefix}*.{damaged}")
    file.write_bytes(file.read_bytes()[:20])
    again = run()
    assert (again.returncode, again.stdout.strip()) == (0, expected), again.stderr[-2000:]
    assert f"{file} could not be read" in again.stderr
    healed = run()     # the damaged file was replaced
    assert (healed.returncode, healed.stdout.strip(), "could not be read" in healed.stderr) == (0, expected, False)
