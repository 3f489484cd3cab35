"""`gnnfuse.environ.getenv` is ``os.environ.get``, only faster: every change a test or a
user makes to the environment between calls is seen by the next read."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnfuse.environ import getenv

NAME = "GNNFUSE_TEST_ENVIRON"
# values os.environ accepts: no NUL, any other text (surrogates excluded: setenv encodes strictly)
VALUES = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20)


def test_absent_variable_gives_the_default(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert getenv(NAME) is None
    assert getenv(NAME, "auto") == "auto"


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), VALUES), min_size=1, max_size=6))
def test_every_change_is_seen_by_the_next_read(values):
    try:
        for value in values:
            if value is None:
                os.environ.pop(NAME, None)
            else:
                os.environ[NAME] = value
            assert getenv(NAME) == os.environ.get(NAME)
            assert getenv(NAME, "d") == os.environ.get(NAME, "d")
    finally:
        os.environ.pop(NAME, None)


def test_a_replaced_environ_is_read_through_its_own_get(monkeypatch):
    monkeypatch.setattr(os, "environ", {NAME: "replaced"})
    assert getenv(NAME) == "replaced"
    assert getenv("GNNFUSE_SURELY_UNSET", "x") == "x"


@pytest.mark.parametrize("variable", ["GNNFUSE_BACKEND", "GNNFUSE_SCHEDULE"])
def test_backend_settings_follow_setenv(monkeypatch, variable):
    monkeypatch.setenv(variable, "cpu")
    assert getenv(variable) == "cpu"
    monkeypatch.delenv(variable)
    assert getenv(variable) is None


def test_the_triton_backends_settings_name_every_variable_they_read(monkeypatch):
    """`executor._read_environment` keeps its last read while the raw values of
    `ENVIRONMENT_VARIABLES` are unchanged: a variable it read that the list left out
    would go unseen when changed."""
    from gnnfuse import environ
    from gnnfuse.backend import tuned_schedule
    from gnnfuse.backend.triton import executor
    read = set()

    class Recording(dict):
        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)
    monkeypatch.setenv("TRITON_INTERPRET", "0")       # else `_autotune` stops before its own variable
    monkeypatch.setattr(environ, "_DATA", Recording(environ._DATA))
    monkeypatch.setattr(executor, "_LAST_READ", (None, None, None))
    monkeypatch.setitem(tuned_schedule._loaded, "path", None)     # its file's variables are read afresh
    executor._read_environment()
    names = {os.fsdecode(key) for key in read}
    assert "GNNFUSE_SCHEDULE" in names and names <= set(executor.ENVIRONMENT_VARIABLES.names)


def test_the_triton_backends_settings_follow_every_change(monkeypatch):
    import every_config
    if every_config.asked():
        pytest.skip("GNNFUSE_TEST_EVERY_CONFIG=1 fixes executor._autotune to True (kernels built "
                    "autotuned), so GNNFUSE_AUTOTUNE, whose reading this test follows, is not read")
    from gnnfuse.backend import tuned_schedule
    from gnnfuse.backend.triton import executor
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    assert executor._read_environment()[0] == "csr"
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "coo")
    first = executor._read_environment()
    assert first[0] == "coo" and executor._read_environment() is first     # kept while nothing changed
    monkeypatch.setenv("TRITON_INTERPRET", "0")      # read, not acted on: Triton is imported already
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "1")
    assert executor._read_environment()[2] is True
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "0")
    assert executor._read_environment()[2] is False
    monkeypatch.setenv("GNNFUSE_SIBLING_KERNELS", "0")
    assert executor._read_environment()[3] is False
    kept = executor._read_environment()
    monkeypatch.setitem(tuned_schedule._loaded, "checked", 0.0)    # the tuner's file is due a look
    assert executor._read_environment() is not kept


def test_variables_read_raw_change_exactly_when_a_variable_does(monkeypatch):
    from gnnfuse.environ import Variables
    watched = Variables((NAME, "GNNFUSE_TEST_OTHER"))
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.delenv("GNNFUSE_TEST_OTHER", raising=False)
    unset = watched.raw()
    monkeypatch.setenv(NAME, "a")
    first = watched.raw()
    assert first != unset and watched.raw() == first
    monkeypatch.setenv(NAME, "b")
    assert watched.raw() != first
    monkeypatch.setenv(NAME, "a")
    assert watched.raw() == first
    monkeypatch.setenv("GNNFUSE_TEST_OTHER", "")
    assert watched.raw() != first
    monkeypatch.setattr(os, "environ", {NAME: "a"})      # a replaced environ is read through its own get
    assert watched.raw() == ("a", None)


def test_a_prepared_runs_settings_hold_the_variables_that_chose_its_backend(monkeypatch):
    """A prepared call reads no backend variable itself: it relies on the backend's
    prepared run declining once they change (`prepared_call.preparer`), which holds
    because the Triton backend's run settings carry their values."""
    from gnnfuse.backend.triton import executor
    from gnnfuse.runtime.prepared_call import BACKEND_VARIABLES
    assert set(BACKEND_VARIABLES) == set(executor.SELECTION_VARIABLES)
    assert set(BACKEND_VARIABLES) <= set(executor.SETTINGS_VARIABLES.names)
    before = executor.run_settings(100)
    monkeypatch.setenv("GNNFUSE_BACKEND", "reference")
    assert executor.run_settings(100) != before


@pytest.mark.parametrize("name", ["GNNFUSE_AUTOTUNE", "GNNFUSE_SIBLING_KERNELS", "GNNFUSE_PAIR_SOURCES",
                                  "GNNFUSE_CHECK_CONFIGS"])
def test_an_on_off_variable_refuses_other_values_by_name(name, monkeypatch):
    """These read ``!= "0"`` (or ``not in ("", "0")``): "false" or "off" meant on, and
    GNNFUSE_CHECK_CONFIGS=false turned the slow check on, silently."""
    from gnnfuse.environ import flag
    for value, expected in (("1", True), ("0", False), ("", "default")):
        monkeypatch.setenv(name, value)
        assert flag(name, True) is (True if expected == "default" else expected)
        assert flag(name, False) is (False if expected == "default" else expected)
    monkeypatch.delenv(name)
    assert flag(name, True) is True
    for bad in ("false", "off", "yes", "2", " 1"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=f"{name} must be 0 or 1 .*{bad!r}"):
            flag(name, True)


def test_the_readers_of_on_off_variables_refuse_other_values(monkeypatch):
    from gnnfuse.backend.triton import config_check, executor
    monkeypatch.setenv("GNNFUSE_CHECK_CONFIGS", "false")
    with pytest.raises(ValueError, match="GNNFUSE_CHECK_CONFIGS"):
        config_check.enabled()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("GNNFUSE_AUTOTUNE", "off")
    with pytest.raises(ValueError, match="GNNFUSE_AUTOTUNE"):
        executor._autotune()


def test_empty_path_and_mode_variables_read_as_unset(monkeypatch, tmp_path):
    """GNNFUSE_CACHE="" put the kernel cache and the tuned-schedule file in the working
    directory; GNNFUSE_TILED_SCORES="" was refused where every other variable takes an
    empty value as unset."""
    from gnnfuse.backend import forced_schedule, kernel_cache, tuned_schedule
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("GNNFUSE_TUNED_SCHEDULES", raising=False)
    monkeypatch.setenv("GNNFUSE_CACHE", "")
    assert tuned_schedule.cache_path() == tmp_path / ".cache" / "gnnfuse" / "tuned_schedules.json"
    assert kernel_cache.cache_dir() == tmp_path / ".cache" / "gnnfuse" / "kernels"
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "")
    monkeypatch.setattr(forced_schedule, "TILED_SCORES_FROM_EDGES", 10)
    assert forced_schedule.tiled_scores(10) and not forced_schedule.tiled_scores(9)


@pytest.mark.parametrize("name,value", [
    ("GNNFUSE_SCHEDULE", "CSR"), ("GNNFUSE_CPU_FEATURE_TILE", "-1"), ("GNNFUSE_TILED_SCORES", "yes"),
    ("GNNFUSE_TYPED_ORDER", "x"), ("GNNFUSE_COMPILE_THREADS", "0"), ("GNNFUSE_AUTOTUNE", "yes"),
    ("GNNFUSE_SIBLING_KERNELS", "off"), ("GNNFUSE_PAIR_SOURCES", "no"), ("GNNFUSE_CHECK_CONFIGS", "yes")])
def test_a_bad_setting_is_refused_on_the_reference_backend_too(name, value, monkeypatch):
    """Each variable was read only by the code it steers, so on the default CPU path (the
    torch reference) these values were silently ignored and the layer ran."""
    import torch

    import gnnfuse.nn as gnn
    monkeypatch.delenv("GNNFUSE_BACKEND", raising=False)
    layer = gnn.GCNConv(3, 2)
    x, edge_index = torch.randn(4, 3), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    layer(x, edge_index)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        layer(x, edge_index)
    monkeypatch.delenv(name)
    layer(x, edge_index)


@pytest.mark.parametrize("name", ["GNNFUSE_BACKNED", "gnnfuse_backend", "GNNFUSE_AUTO_TUNE"])
def test_a_misspelled_variable_name_is_warned_about(name, monkeypatch):
    """A setting under a mistyped name was silently never read (GNNFUSE_BACKNED=cpu ran
    the reference backend)."""
    import torch

    import gnnfuse.nn as gnn
    from gnnfuse.runtime import settings_check
    monkeypatch.setattr(settings_check, "_LAST", [None])
    monkeypatch.setenv(name, "1")
    with pytest.warns(RuntimeWarning, match=f"{name}.*did you mean"):
        gnn.GCNConv(3, 2)(torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]]))


def test_a_misspelled_variable_name_is_warned_about_at_the_callers_line(monkeypatch):
    """It pointed at gnnfuse/runtime/compiled.py (a fixed stacklevel=4); it is shown at
    the user's call of the layer."""
    import sys
    import warnings

    import torch

    import gnnfuse.nn as gnn
    from gnnfuse.runtime import settings_check
    monkeypatch.setattr(settings_check, "_LAST", [None])
    monkeypatch.setenv("GNNFUSE_BACKNED", "cpu")
    layer, x, edge_index = gnn.GCNConv(3, 2), torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        layer(x, edge_index)
    assert [(w.filename, w.lineno) for w in caught if "did you mean" in str(w.message)] == [(__file__, line)]
