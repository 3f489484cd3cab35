"""Every command says which of its output files already exist and will be replaced:
``explain --dot`` and ``train --save`` replaced a file of the same name without a word."""
from __future__ import annotations

import pytest

from gnnfuse.cli import main
from gnnfuse.output_paths import replaced_outputs


def test_replaced_outputs_names_only_the_files_that_exist(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    note = replaced_outputs({"--json": tmp_path / "old.json", "--plot": tmp_path / "new.png", "--dot": None})
    assert note == f"note: --json {tmp_path / 'old.json'} exists and is replaced"
    assert replaced_outputs({"--json": tmp_path / "new.json"}) is None


def test_explain_says_it_replaces_an_existing_dot_file(tmp_path, capsys):
    dot = tmp_path / "graph.dot"
    dot.write_text("an older drawing")
    assert main(["explain", "--model", "sage", "--dot", str(dot)]) == 0
    assert f"note: --dot {dot} exists and is replaced" in capsys.readouterr().out
    assert dot.read_text() != "an older drawing"


@pytest.mark.parametrize("resume", [False, True])
def test_train_says_it_replaces_an_existing_checkpoint_unless_resuming_it(tmp_path, capsys, resume):
    path = tmp_path / "runs.pt"
    assert main(["train", "--epochs", "1", "--save", str(path)]) == 0
    capsys.readouterr()
    assert main(["train", "--epochs", "1", "--save", str(path), *(["--resume"] if resume else [])]) == 0
    out = capsys.readouterr().out
    assert (f"note: --save {path} exists and is replaced" in out) is not resume
