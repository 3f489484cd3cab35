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
