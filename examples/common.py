"""What the examples share: the synthetic data set and a small full-graph training loop.

The examples import this as a sibling module (``python examples/<name>.py`` puts this
folder on ``sys.path``).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import gnnfuse
from gnnfuse.data import load_dataset


@dataclass
class Data:
    x: torch.Tensor
    y: torch.Tensor
    graph: gnnfuse.Graph            # with one self loop per vertex, so every vertex attends to itself
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    num_classes: int


def load() -> Data:
    """The seeded synthetic planted-partition data set (2,000 nodes, 5 classes)."""
    ds = load_dataset("synthetic")
    graph = ds.graph.remove_self_loops().add_self_loops()
    return Data(ds.x, ds.y, graph, ds.train_mask, ds.val_mask, ds.test_mask, ds.num_classes)


def parse_epochs(description: str, default: int = 30) -> int:
    """``--epochs``, at least 1: `train` reports the last epoch's accuracy, so with none it
    failed on an unset variable after loading the data."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=default)
    epochs = parser.parse_args().epochs
    if epochs < 1:
        parser.error(f"--epochs must be at least 1, got {epochs}")
    return epochs


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> float:
    return (logits[mask].argmax(1) == y[mask]).float().mean().item()


def train(model: nn.Module, data: Data, epochs: int, lr: float = 0.01) -> float:
    """Adam on the training nodes, a line per epoch; returns the final test accuracy."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=5e-4)
    for epoch in range(1, epochs + 1):
        begin = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.graph)[data.train], data.y[data.train])
        loss.backward()
        optimizer.step()
        step_ms = (time.perf_counter() - begin) * 1e3
        model.eval()
        with torch.no_grad():
            logits = model(data.x, data.graph)
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}  train {accuracy(logits, data.y, data.train):.3f}  "
              f"val {accuracy(logits, data.y, data.val):.3f}  step {step_ms:6.1f} ms")
    test = accuracy(logits, data.y, data.test)
    print(f"test accuracy {test:.3f}")
    return test
