"""The on-disk kernel cache under concurrent writers (several training ranks compile the
same kernels at once)."""
from __future__ import annotations

import hashlib

from gnnfuse.backend import kernel_cache


def test_a_kernel_file_another_process_is_still_writing_is_not_imported_half_written(tmp_path, monkeypatch):
    """A second rank found the file of the first rank's ``write_text`` created but still
    empty and imported it: ``AttributeError: module ... has no attribute``."""
    monkeypatch.setenv("GNNFUSE_CACHE", str(tmp_path))
    source = "def kernel_under_test():\n    return 42\n"
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    (kernel_cache.cache_dir() / f"kernel_under_test_{digest}.py").write_text("")   # mid-write
    assert kernel_cache.load_kernel(source, "kernel_under_test")() == 42
