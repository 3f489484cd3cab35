"""The ``gnnfuse`` command line: `info` output, `train` logging and reference accuracy."""
from __future__ import annotations

import pytest
import torch

from gnnfuse.cli import _parser, build_model, main, train
from gnnfuse.data import load_dataset


def test_info_prints_counts_and_degree_summary(shared_data, capsys):
    assert main(["info", "cora", "--root", str(shared_data)]) == 0
    out = capsys.readouterr().out
    for expected in ("2708", "10556", "1433", "classes     7", "train 140 / val 500 / test 1000",
                     "median", "p99", "isolated"):
        assert expected in out


def test_train_logs_epochs_and_summary(capsys):
    assert main(["train", "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("epoch ") >= 3 and "peak" in out and " ms " in out
    assert out.strip().splitlines()[-1].startswith("summary: best val acc")


def test_train_cuda_without_cuda_is_a_usage_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--device", "cuda", "--epochs", "1"])
    assert exit_info.value.code == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_build_model_is_called_as_model_x_graph():
    data = load_dataset("synthetic")
    model = build_model("gcn", data.num_features, 8, data.num_classes, 0.5)
    assert model(data.x, data.graph).shape == (data.graph.num_nodes, data.num_classes)
    model.eval()                                        # sparse features (as train passes cora's) agree
    assert torch.allclose(model(data.x.to_sparse(), data.graph), model(data.x, data.graph), atol=1e-5)
    with pytest.raises(ValueError, match="gcn"):
        build_model("gat2", 4, 4, 2, 0.0)


def test_gcn_learns_the_default_synthetic_data_set():
    result = train(_parser().parse_args(["train", "--epochs", "100"]))
    assert result["test_acc"] > 0.7


def test_gcn_reaches_published_accuracy_on_cora(shared_data):
    result = train(_parser().parse_args(["train", "--dataset", "cora", "--root", str(shared_data)]))
    assert result["test_acc"] >= 0.78
