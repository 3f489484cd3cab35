"""Masked labels on padded graph batches (``DataLoader(static_shapes=True,
label_mask=True)``): a regression's float ``y`` padded with 0 and ``y_mask`` 0 on the
padded rows, so that a loss multiplied by the mask is the plain batch's, and the step
replays from a CUDA graph (`training.GraphStepCapture`; on the CPU with the stand-in
graph of test_static_shapes.py). The oracle is PyG's plain batch, in float64."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader as PyGDataLoader

import gnnfuse.nn
from gnnfuse.loader import DataLoader, GraphCapacities
from gnnfuse.loader.padded_graph_batch import pad_graph_batch, unpadded
from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning
from gnnfuse.training import GraphStepCapture
from test_padded_graph_batch import molecules
from test_static_shapes import _Recorder


def _regression(count: int, seed: int = 0, level: str = "graph") -> list[Data]:
    gen = torch.Generator().manual_seed(seed + 100)
    return [Data(x=d.x, edge_index=d.edge_index,
                 y=torch.randn(1 if level == "graph" else d.num_nodes, generator=gen, dtype=torch.float64))
            for d in molecules(count, seed)]


class _Regressor(torch.nn.Module):
    def __init__(self, level: str = "graph"):
        super().__init__()
        self.body, self.head, self.level = gnnfuse.nn.GIN(5, 6, 2), torch.nn.Linear(6, 1), level

    def forward(self, x, edge_index, batch, graphs):
        h = self.body(x, edge_index)
        return self.head(pyg_nn.global_add_pool(h, batch, size=graphs) if self.level == "graph" else h)[:, 0]


def _masked_l1(out, batch):
    return (F.l1_loss(out, batch.y, reduction="none") * batch.y_mask).sum() / batch.y_mask.sum()


def _masked_by_where(out, batch):
    terms = torch.where(batch.y_mask.bool(), (out - batch.y) ** 2, torch.zeros_like(out))
    return terms.sum() / batch.y_mask.sum()


@pytest.mark.parametrize("level", ["graph", "node"])
@pytest.mark.parametrize("loss", [_masked_l1, _masked_by_where])
def test_a_masked_loss_on_the_padded_batch_is_the_plain_batchs(level, loss):
    torch.manual_seed(0)
    model = _Regressor(level).double()
    graphs = _regression(5, seed=3, level=level)
    plain = Batch.from_data_list(graphs)
    padded = pad_graph_batch(Batch.from_data_list(graphs), GraphCapacities(64, 128, 8), label_mask=True)
    rows = plain.y.shape[0]
    assert padded.y.shape[0] > rows and torch.equal(padded.y[rows:], torch.zeros_like(padded.y[rows:]))
    assert torch.equal(padded.y_mask, (torch.arange(padded.y.shape[0]) < rows).double())
    results = []
    for batch, fn in ((plain, lambda out, b: F.l1_loss(out, b.y) if loss is _masked_l1 else F.mse_loss(out, b.y)),
                      (padded, loss)):
        model.zero_grad()
        value = fn(model(batch.x, batch.edge_index, batch.batch, batch.num_graphs), batch)
        value.backward()
        results.append((value.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-12, atol=1e-12)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_bool_label_is_padded_with_false_and_masked():
    graphs = [Data(x=d.x, edge_index=d.edge_index, y=d.y > 0) for d in molecules(3, seed=4)]
    padded = pad_graph_batch(Batch.from_data_list(graphs), GraphCapacities(64, 64, 6), label_mask=True)
    assert padded.y.dtype == torch.bool and not padded.y[3:].any()
    assert padded.y_mask.dtype == torch.get_default_dtype() and padded.y_mask.tolist() == [1, 1, 1, 0, 0, 0]


def test_every_batch_carries_y_mask_and_unpadded_keeps_its_real_rows():
    data = _regression(12, seed=5)
    loader = DataLoader(data, batch_size=4, static_shapes=True, label_mask=True)
    for batch in loader:
        real = unpadded(batch)
        assert batch.y_mask.shape == batch.y.shape and real.y_mask.shape == real.y.shape
        assert real.y_mask.tolist() == [1.0] * real.num_graphs and batch.y_mask.sum() == real.num_graphs
    too_small = DataLoader(data, batch_size=4, static_shapes=True, label_mask=True,
                           capacities=GraphCapacities(4, 4, 5))
    batch = next(iter(too_small))        # over the capacities: unpadded, and still masked
    assert batch.num_graphs == 4 and batch.y_mask.tolist() == [1.0] * 4


def test_masked_labels_are_refused_where_they_cannot_apply():
    data = _regression(6)
    with pytest.raises(ValueError, match="label_mask=True and multiply the loss by batch.y_mask"):
        next(iter(DataLoader(data, batch_size=2, static_shapes=True)))
    with pytest.raises(ValueError, match="pass static_shapes=True with it"):
        DataLoader(data, batch_size=2, label_mask=True)
    marked = [Data(x=d.x, edge_index=d.edge_index, y=d.y, y_mask=torch.ones(1)) for d in data]
    with pytest.raises(ValueError, match="already have a 'y_mask'"):
        next(iter(DataLoader(marked, batch_size=2, static_shapes=True, label_mask=True)))


def _training(captured: bool, loss_fn, graphs: int = 45):
    torch.manual_seed(0)
    model = _Regressor().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(batch):
        optimizer.zero_grad()
        loss = loss_fn(model(batch.x, batch.edge_index, batch.batch, batch.num_graphs), batch)
        loss.backward()
        optimizer.step()
        return loss.detach()
    data = _regression(graphs)
    shuffle = {"shuffle": True, "generator": torch.Generator().manual_seed(1)}
    if captured:
        loader = DataLoader(data, batch_size=8, static_shapes=True, label_mask=True, **shuffle)
        factory = type("R", (_Recorder,), {"model": model, "optimizer": optimizer})
        run = GraphStepCapture(step, optimizers=[optimizer], modules=[model], _graph_factory=factory)
    else:       # PyG's batches, all of whose rows are real
        loader = PyGDataLoader(data, batch_size=8, **shuffle)

        def run(batch):
            batch.y_mask = torch.ones_like(batch.y)
            return step(batch)
    losses = [float(run(batch)) for batch in loader]
    return losses, list(model.parameters()), run


def test_a_masked_regression_step_replays_and_trains_as_pygs():
    eager = _training(False, lambda out, b: F.l1_loss(out, b.y))
    replayed = _training(True, _masked_l1)
    assert replayed[2].status == "captured" and replayed[2].replayed == 2
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12)
    for a, b in zip(replayed[1], eager[1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("loss_fn, named", [
    (lambda out, b: F.l1_loss(out, b.y), "l1_loss"),
    (lambda out, b: (F.mse_loss(out, b.y, reduction="none").mean() * b.y_mask).sum(), "mean"),
    (lambda out, b: (torch.cumsum(out - b.y, 0) * b.y_mask).abs().sum(), "cumsum"),
    (lambda out, b: (F.l1_loss(out, b.y, reduction="none") * b.y_mask).mean(), "mean"),
    (lambda out, b: torch.where(b.y_mask.bool(), (out - b.y).abs(), torch.ones_like(out)).sum(), "sum"),
    (lambda out, b: ((out - b.y) * b.y_mask + 1).sum(), "add"),
    (lambda out, b: (F.mse_loss(out, b.y, reduction="none") * (b.y_mask + 1) / 2).sum(), "sum"),
    (lambda out, b: (F.l1_loss(out, b.y, reduction="none") * b.y_mask.clamp(min=0.5)).sum(), "sum"),
    (lambda out, b: ((out - b.y).abs() * torch.ones_like(b.y_mask)).sum() / b.y_mask.sum(), "sum"),
    (lambda out, b: torch.where(b.y_mask < 1, 0.0, (out - b.y) ** 2).sum() / b.y_mask.sum(), "sum"),
])
def test_an_unmasked_use_of_the_labels_runs_eagerly_with_a_warning(loss_fn, named):
    """Reduced before the mask, mixed along the rows first, averaged after it (a mean
    divides by the padded count), selected against non-zeros or shifted off zero after
    it, the padding rows would count: the step falls back, naming the op, and trains on
    PyG's batches."""
    eager = _training(False, loss_fn)
    with pytest.warns(CaptureFallbackWarning, match=f"{named}.*multiplying it by batch.y_mask"):
        replayed = _training(True, loss_fn)
    assert replayed[2].replayed == 0
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("loss_fn, named", [
    (lambda out, b: (F.l1_loss(out, b.y, reduction="none") * b.y_mask).sum() / (b.y_mask.mean() * 8),
     "mean of batch.y_mask"),
    (lambda out, b: (F.l1_loss(out, b.y, reduction="none") * b.y_mask).sum() / (8 - (1 - b.y_mask).sum()),
     "sum of a value computed row by row from batch.y_mask"),
    (lambda out, b: (F.l1_loss(out, b.y, reduction="none") * b.y_mask).sum() * b.y_mask.prod(), "prod of batch.y_mask"),
])
def test_a_reduction_of_the_mask_the_padding_changes_runs_eagerly_with_a_warning(loss_fn, named):
    """The watch followed the labels and the mask's masking values, but a reduction of
    ``y_mask`` itself over its rows went unseen: ``y_mask.mean()`` is 1 on the plain
    batch and the real rows' share on a padded one, ``(1 - y_mask).sum()`` counts the
    padding rows, ``y_mask.prod()`` is 0 there. Such a step replayed (the first: the
    second batch's loss 1.2597 replayed against 1.1197 on PyG's batches); it now falls
    back, naming the op."""
    eager = _training(False, loss_fn)
    with pytest.warns(CaptureFallbackWarning, match=f"{named}.*, which a padded batch's padding rows"):
        replayed = _training(True, loss_fn)
    assert replayed[2].replayed == 0
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12)


def test_a_row_picked_from_masked_values_is_not_called_the_labels_as_an_index():
    """``(loss * y_mask)[-1]`` picks a padded batch's last row, a padding one: named, but
    the reason given was "the labels as an index: a padding label reads entry -100" --
    no label indexed anything (the values indexed were the masked loss terms)."""
    from gnnfuse.training.label_use import LabelWatch
    y, y_mask, out = torch.randn(4), torch.ones(4), torch.randn(4)
    with LabelWatch([y], [y_mask]) as watch:
        (F.l1_loss(out, y, reduction="none") * y_mask)[-1].sum()
    assert watch.misuse is not None and "__getitem__" in watch.misuse and "as an index" not in watch.misuse
    classes = torch.tensor([0, 2, 1, 1])
    with LabelWatch([classes]) as watch:          # a table read at the labels: that reason stands
        torch.randn(3, 2)[classes].sum()
    assert "the labels as an index" in watch.misuse


def _relative(out, b):
    return (((out - b.y).abs() / b.y.abs()) * b.y_mask).sum() / b.y_mask.sum()


@pytest.mark.parametrize("loss_fn, named", [
    (_relative, "div"),
    (lambda out, b: (F.mse_loss(out, b.y.abs().log(), reduction="none") * b.y_mask).sum() / b.y_mask.sum(), "log"),
    (lambda out, b: ((out - b.y).abs().sqrt() * b.y_mask).sum() / b.y_mask.sum(), "sqrt"),
    (lambda out, b: (F.mse_loss(out[:, None], b.y, reduction="none") * b.y_mask).sum() / b.y_mask.sum(), "mse_loss"),
    (lambda out, b: (F.l1_loss(out, b.y, reduction="none")[:, None] * b.y_mask).sum() / b.y_mask.sum(), "mul"),
])
def test_a_masked_loss_the_mask_cannot_repair_runs_eagerly_with_a_warning(loss_fn, named):
    """A quotient by the labels, their log or root (inf or NaN on a padding row's 0 label,
    or in its gradient: inf * 0 is NaN) and a broadcast spreading the rows over columns
    (a [G] label against a [G, 1] output: the mask zeroes the padding's rows, not its
    columns) give other numbers on a padded batch however they are masked: the step
    falls back, naming the op, and trains as on PyG's batches."""
    eager = _training(False, loss_fn)
    with pytest.warns(CaptureFallbackWarning, match=f"{named}.*from batch.y"):
        replayed = _training(True, loss_fn)
    assert replayed[2].replayed == 0
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12,
                               equal_nan=True)


@pytest.mark.parametrize("loss_fn", [
    lambda out, b: ((((out - b.y) / 2.0) ** 2) * b.y_mask).sum() / b.y_mask.sum(),
    lambda out, b: (F.smooth_l1_loss(out, b.y, reduction="none").sigmoid() * b.y_mask).sum() / b.y_mask.sum(),
    lambda out, b: ((out[:, None] - b.y[:, None]).square().sum(dim=1) * b.y_mask).sum() / b.y_mask.sum(),
    lambda out, b: (F.l1_loss(out, b.y, reduction="none") * (b.y_mask / b.y_mask.sum())).sum(),
    lambda out, b: ((out - b.y)[:, None].abs() * b.y_mask.bool()[:, None].double()).sum() / b.y_mask.sum(),
    lambda out, b: torch.where(b.y_mask > 0, (out - b.y) ** 2, 0.0).sum() / b.y_mask.sum(),
    lambda out, b: ((out - b.y) ** 2 * (b.y_mask[:, None] > 0).any(dim=1)).sum() / b.y_mask.sum(),
])
def test_masked_losses_finite_on_the_padding_still_replay(loss_fn):
    eager = _training(False, loss_fn)
    replayed = _training(True, loss_fn)
    assert replayed[2].status == "captured" and replayed[2].replayed == 2
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12)
