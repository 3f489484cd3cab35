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
