"""Graph-classification steps replayed from a CUDA graph (`training.GraphStepCapture`,
`training.static_graph_batch`) on batches padded by ``DataLoader(static_shapes=True)``.

On the CPU the capture's bookkeeping runs with a stand-in graph that records without
running the step and replays by running it (as test_static_shapes.py's), so the audit
for host syncs, the sealed graph cache and the static batch's rewrites are all checked;
the losses and weights of replayed steps equal eager steps on PyG's plain batches
(float64). On a GPU machine a real CUDA graph replays them too
(`test_steps_replayed_from_a_cuda_graph_train_as_eager_steps`)."""
from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch_geometric.loader import DataLoader as PyGDataLoader

import gnnfuse.nn
from gnnfuse.graph import Graph
from gnnfuse.loader import DataLoader
from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning
from gnnfuse.training import GraphStepCapture
from gnnfuse.training.static_graph_batch import StaticGraphBatch
from oracle_check import device_for
from test_padded_graph_batch import molecules
from test_static_shapes import _Recorder


class _Classifier(torch.nn.Module):
    def __init__(self, name: str, norm: str | None = None):
        super().__init__()
        kw = {"heads": 2} if name == "GAT" else {}
        self.body = getattr(gnnfuse.nn, name)(5, 6, 2, norm=norm, **kw)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x, edge_index, batch, graphs):
        return self.head(pyg_nn.global_mean_pool(self.body(x, edge_index), batch, size=graphs))


def _training(name: str, captured: bool, device: str = "cpu", graphs: int = 45, norm: str | None = None,
              pool_size: bool = True, step_extra=None, recorder: bool = True, loss_fn=F.cross_entropy,
              pass_modules: bool = True):
    torch.manual_seed(0)
    model = _Classifier(name, norm).double().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(batch):
        optimizer.zero_grad()
        size = batch.num_graphs if pool_size else None
        loss = loss_fn(model(batch.x, batch.edge_index, batch.batch, size), batch.y)
        loss.backward()
        optimizer.step()
        if step_extra:
            step_extra(batch)
        return loss.detach()
    data = molecules(graphs)
    shuffle = {"shuffle": True, "generator": torch.Generator().manual_seed(1)}
    if captured:
        loader = DataLoader(data, batch_size=8, static_shapes=True, **shuffle)
        factory = type("R", (_Recorder,), {"model": model, "optimizer": optimizer}) if recorder else None
        run = GraphStepCapture(step, optimizers=[optimizer], modules=[model] if pass_modules else [],
                               _graph_factory=factory)
    else:
        loader, run = PyGDataLoader(data, batch_size=8, **shuffle), step
    losses = [float(run(batch.to(device))) for batch in loader]
    return losses, list(model.parameters()), run


def _same_training(a, b):
    torch.testing.assert_close(torch.tensor(a[0]), torch.tensor(b[0]), rtol=1e-9, atol=1e-12)
    for x, y in zip(a[1], b[1]):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["GIN", "GraphSAGE", "GCN", "GAT"])
def test_replayed_graph_steps_train_as_eager_steps_on_pygs_batches(name):
    """Six batches: the first run on PyG's batch (its use of the labels watched), two
    eager warm-up steps, the audited one that captures, then replays, the epoch's short
    last batch (5 graphs of 8) among them: its padded shapes are the others'."""
    eager = _training(name, False)
    replayed = _training(name, True)
    run = replayed[2]
    assert run.status == "captured" and (run.eager, run.replayed) == (4, 2)
    _same_training(replayed, eager)


def test_steps_on_the_triton_backend_replay_and_train_as_eager_steps(monkeypatch):
    """Whatever the Triton executor reads of the static graph (segments, split-row
    slots, the reverse CSR) is rebuilt by the step, so nothing is left cached."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    eager = _training("GIN", False, device=device, graphs=36)
    replayed = _training("GIN", True, device=device, graphs=36)
    assert replayed[2].status == "captured" and replayed[2].replayed == 1
    _same_training(replayed, eager)


def test_a_model_normalising_over_all_rows_runs_eagerly_with_a_warning():
    with pytest.warns(CaptureFallbackWarning, match="normalises over all rows"):
        replayed = _training("GIN", True, norm="batch_norm")
    assert replayed[2].replayed == 0 and "normalises over all rows" in replayed[2].status


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_row_mixing_model_on_a_cpu_warns_only_in_mode_on(mode):
    """Mode "auto" runs eagerly on a CPU without a word, as `StepCapture` does; with a
    BatchNorm it warned at construction that the padded rows would count, on a CPU where
    nothing is captured anyway. Its status still says why."""
    model = _Classifier("GIN", "batch_norm").double()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = GraphStepCapture(lambda batch: None, modules=[model], mode=mode)
    assert [str(w.message) for w in caught if issubclass(w.category, CaptureFallbackWarning)] == (
        [] if mode == "auto" else [f"gnnfuse: the {run._STEP} is not captured in a CUDA graph and runs eagerly: "
                                   f"{run.reason}"])
    assert "BatchNorm" in run.status and "normalises over all rows" in run.status


def test_pygs_layer_norm_over_whole_graphs_runs_eagerly_with_a_warning():
    """PyG's ``LayerNorm`` (``mode="graph"``, what ``norm="layer_norm"`` makes) normalises
    over all rows of a graph -- of the whole batch when it gets no ``batch`` vector, as in
    GIN's MLPs -- so the padded rows would enter its statistics; it was replayed."""
    with pytest.warns(CaptureFallbackWarning, match="LayerNorm.*normalises over all rows"):
        replayed = _training("GIN", True, norm="layer_norm")
    assert replayed[2].replayed == 0 and "LayerNorm" in replayed[2].status


@pytest.mark.parametrize("norm", ["batch_norm", "graph_norm", "layer_norm"])
def test_steps_refused_for_row_mixing_run_on_the_unpadded_batch(norm):
    """The eager fallback of a model normalising over all rows gets the batch as PyG
    collated it: run on the padded one, its statistics counted the padded rows (losses
    0.3-0.6 off PyG's batches) under a warning that said they would not be."""
    eager = _training("GIN", False, norm=norm)
    with pytest.warns(CaptureFallbackWarning, match="normalises over all rows"):
        replayed = _training("GIN", True, norm=norm)
    assert replayed[2].replayed == 0
    _same_training(replayed, eager)


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm"])
def test_a_row_mixing_module_left_out_of_modules_is_found_by_the_first_step(norm):
    """The row-mixing check read only ``modules=``: a step whose model was not passed
    there (``GraphStepCapture(step, optimizers=[opt])``) replayed a BatchNorm over the
    padded rows without a word (losses and weights 0.66 off PyG's batches). The first
    padded batch's step, run eagerly on PyG's batch, now looks at every module it calls."""
    eager = _training("GIN", False, norm=norm)
    with pytest.warns(CaptureFallbackWarning, match="normalises over all rows"):
        replayed = _training("GIN", True, norm=norm, pass_modules=False)
    assert replayed[2].replayed == 0 and "normalises over all rows" in replayed[2].status
    _same_training(replayed, eager)


def _batch_normalised(out, y):
    return F.cross_entropy(F.batch_norm(out, None, None, training=True), y)


def test_a_functional_batch_norm_in_the_step_is_found_by_the_first_step():
    """``F.batch_norm`` with batch statistics, written in the step rather than held by a
    module, normalised over the padding graphs' rows too and was replayed without a word."""
    eager = _training("GIN", False, loss_fn=_batch_normalised)
    with pytest.warns(CaptureFallbackWarning, match="batch_norm.*normalises over all rows"):
        replayed = _training("GIN", True, loss_fn=_batch_normalised)
    assert replayed[2].replayed == 0
    _same_training(replayed, eager)


def _binary(out, y):
    return F.binary_cross_entropy_with_logits(out[:, 0], y.double().clamp(max=1))


def _accuracy_weighted(out, y):
    return F.cross_entropy(out, y) * (out.argmax(1) == y).double().mean()


def _unreduced_mean(out, y):
    return F.cross_entropy(out, y, reduction="none").mean()


_REMAP = torch.arange(200).remainder(3).flip(0)     # 200 entries: a padding label's -100 is a valid index


def _remapped(out, y):
    return F.cross_entropy(out, _REMAP[y])


def _summed_over_len(out, y):
    return F.cross_entropy(out, y, reduction="sum") / len(y)


def _summed_over_rows(out, y):
    return F.cross_entropy(out, y, reduction="sum") / y.shape[0]


def _summed_over_numel(out, y):
    return F.cross_entropy(out, y, reduction="sum") / torch.numel(y)


@pytest.mark.parametrize("loss_fn", [_binary, _accuracy_weighted, _unreduced_mean, _remapped, _summed_over_len,
                                     _summed_over_rows, _summed_over_numel])
def test_a_loss_that_reads_the_padding_labels_runs_eagerly_with_a_warning(loss_fn):
    """Only a loss ignoring IGNORE_LABEL (cross-entropy's and nll's ignore_index) is the
    same on a padded batch: a binary loss over ``y.float()`` counted every padding graph
    with target -100, a mean over ``y == pred`` every padding graph as wrong; replayed,
    silently; and so a mean of cross-entropy's unreduced losses, whose padding graphs' zeros
    it counted. So did labels remapped through a table (``table[y]``: -100 read a real
    class) and a sum divided by ``len(y)``, ``y.shape[0]`` or ``torch.numel(y)`` (the padded count): plain
    ints and an index, which the watch had let pass. Which the step does is watched on its
    first batch, run on PyG's batch."""
    eager = _training("GIN", False, loss_fn=loss_fn)
    with pytest.warns(CaptureFallbackWarning, match="of batch.y.*IGNORE_LABEL"):
        replayed = _training("GIN", True, loss_fn=loss_fn)
    assert replayed[2].replayed == 0
    _same_training(replayed, eager)


def _gnnfuse_rows(out, y):
    return gnnfuse.nn.functional.cross_entropy(out, y, rows=torch.arange(out.shape[0]))


def _gnnfuse_linear(out, y):
    return gnnfuse.nn.functional.linear_cross_entropy(out, torch.eye(3, dtype=out.dtype), None, y)


@pytest.mark.parametrize("loss_fn", [_gnnfuse_rows, _gnnfuse_linear])
def test_gnnfuses_own_losses_ignore_the_padding_labels_and_replay(loss_fn):
    """gnnfuse's cross_entropy (with rows) and linear_cross_entropy ignore IGNORE_LABEL as
    torch's losses do, but the watch saw them op by op, took their checks of the target's
    shape for a row count of the labels, and ran every step eagerly with a warning."""
    eager = _training("GIN", False, loss_fn=loss_fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        replayed = _training("GIN", True, loss_fn=loss_fn)
    assert replayed[2].status == "captured" and replayed[2].replayed == 2
    _same_training(replayed, eager)


def test_off_a_cuda_device_every_batch_runs_on_pygs_batch():
    """On a CPU no step is captured, so every batch runs as PyG collated it; the second
    batch had run on its padded copy (loaded into the static batch before the capture found
    the device), and a step reading ``batch.num_graphs`` gave other numbers for it alone."""
    seen = []
    eager = _training("GIN", False, step_extra=lambda batch: seen.append(batch.num_graphs))
    expected, seen[:] = list(seen), []
    run = _training("GIN", True, recorder=False, step_extra=lambda batch: seen.append(batch.num_graphs))
    assert seen == expected and run[2].replayed == 0 and "need a CUDA device" in run[2].status
    _same_training(run, eager)


def test_off_a_cuda_device_mode_auto_says_nothing_about_the_labels():
    """'auto' runs eagerly and silently on a CPU; the label check ran first there and
    warned about a loss that no capture would have replayed."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        run = _training("GIN", True, recorder=False, loss_fn=_binary)
    assert "need a CUDA device" in run[2].status
    _same_training(run, _training("GIN", False, loss_fn=_binary))


def test_pooling_that_reads_the_graph_count_back_keeps_the_step_eager():
    """PyG's pooling without ``size`` reads ``batch.max()`` back: the audit refuses to
    capture a step with a host sync, and the steps run eagerly with the same numbers."""
    eager = _training("GraphSAGE", False, pool_size=False)
    with pytest.warns(CaptureFallbackWarning, match="synchron|item|int"):
        replayed = _training("GraphSAGE", True, pool_size=False)
    assert replayed[2].replayed == 0
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-9, atol=1e-12)


def test_a_step_that_caches_on_the_batchs_graph_is_not_replayed():
    """Anything cached on the static graph during warm-up would be replayed stale."""
    def cache_something(batch):
        Graph.coerce(batch.edge_index, batch.num_nodes).cached("user_norm", lambda g: g.in_degrees().double())
    eager = _training("GIN", False)
    with pytest.warns(CaptureFallbackWarning, match="user_norm"):
        replayed = _training("GIN", True, step_extra=cache_something)
    assert replayed[2].replayed == 0 and "user_norm" in replayed[2].status
    assert "loader.layouts" not in replayed[2].status      # NeighborLoader's remedy: no graph loader has it
    _same_training(replayed, eager)


def test_a_step_that_rebinds_its_batchs_attributes_reads_every_batch():
    """A step assigning ``batch.x = ...`` (a cast, a rescaling) rebound the static batch's
    attribute: every later step read the tensor the previous step made instead of the
    batch copied into the static one (losses up to 1.0 off, silently)."""
    def rebind(batch):
        batch.x = batch.x * 2
        batch.edge_index = batch.edge_index[:, :1]
    eager = _training("GraphSAGE", False, step_extra=rebind)
    replayed = _training("GraphSAGE", True, step_extra=rebind)
    assert replayed[2].status == "captured" and replayed[2].replayed == 2
    _same_training(replayed, eager)


def test_the_static_batch_serves_one_graph_rewritten_per_batch_and_refuses_other_shapes():
    loader = DataLoader(molecules(24), batch_size=8, static_shapes=True)
    first, second, third = list(loader)
    static = StaticGraphBatch(first)
    assert Graph.coerce(static.batch.edge_index, first.num_nodes) is static.graph
    assert static.load(second) is None
    assert torch.equal(static.batch.edge_index, second.edge_index) and torch.equal(static.batch.x, second.x)
    batch = static.complete()
    graph = Graph.coerce(batch.edge_index, first.num_nodes)
    assert graph is static.graph            # the same graph after the rewrite, its layouts the new edges'
    plain = Graph.from_edge_index(second.edge_index, first.num_nodes)
    assert torch.equal(graph.in_degrees(), plain.in_degrees()) and torch.equal(graph.csr().col, plain.csr().col)
    other = DataLoader(molecules(24, seed=5), batch_size=8, static_shapes=True, capacities=loader.capacities)
    assert static.load(next(iter(other))) is None
    wider = next(iter(DataLoader(molecules(8, features=6), batch_size=8, static_shapes=True,
                                 capacities=loader.capacities)))
    assert "x" in str(static.load(wider))
    unpadded = next(iter(PyGDataLoader(molecules(8), batch_size=8)))
    assert "not padded" in static.load(unpadded)
    with pytest.raises(ValueError, match="padded batch"):
        StaticGraphBatch(unpadded)
    assert third is not None


def test_a_static_batchs_graph_and_edge_index_go_with_it():
    """The index cache holds the static graph while the static ``edge_index`` lives; the
    graph's endpoints were views of that tensor, which kept it alive: neither was ever
    freed (each capture's graph and layouts held until 64 other inputs evicted them)."""
    static = StaticGraphBatch(next(iter(DataLoader(molecules(8), batch_size=4, static_shapes=True))))
    graph, edge_index = weakref.ref(static.graph), weakref.ref(static.batch.edge_index)
    del static
    gc.collect()
    assert graph() is None and edge_index() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real CUDA graph needs a GPU")
@pytest.mark.parametrize("name", ["GIN", "GAT"])
def test_steps_replayed_from_a_cuda_graph_train_as_eager_steps(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        replayed = _training(name, True, device="cuda", recorder=False)
    eager = _training(name, False, device="cuda")
    assert replayed[2].status == "captured" and replayed[2].replayed == 2
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-7, atol=1e-9)
    for x, y in zip(replayed[1], eager[1]):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-8)


def test_a_steps_layers_share_one_self_looped_graph_built_again_in_the_next_step():
    """GCN's and GAT's fixed-shape self loops on the static graph are built by the
    step's first layer and read by the others (`fixed_shape.per_step`), and built anew
    once the next batch is in: a replay rebuilds them, and no eager step reads the last
    batch's."""
    from gnnfuse.graph.fixed_shape import begin_step, per_step
    from gnnfuse.nn.conv import _with_loops
    loader = DataLoader(molecules(16), batch_size=8, static_shapes=True)
    first, second = list(loader)
    static = StaticGraphBatch(first)
    graph = Graph.coerce(static.complete().edge_index, first.num_nodes)
    looped = _with_loops(graph, True, vertex_data_only=True)
    assert _with_loops(graph, True, vertex_data_only=True) is looped
    static.load(second)
    again = _with_loops(Graph.coerce(static.complete().edge_index, first.num_nodes), True, vertex_data_only=True)
    assert again is not looped
    real = int(second.batch.lt(second.num_graphs - 1).sum())
    eager = Graph.from_edge_index(second.edge_index, first.num_nodes).remove_self_loops().add_self_loops()
    assert torch.equal(again.in_degrees()[:real], eager.in_degrees()[:real])
    assert static.added_cache_keys() == []
    built = []
    block = Graph.from_edge_index(torch.tensor([[0], [1]]), 2)       # no step begun: built on every call
    assert per_step(block, "k", lambda g: built.append(1) or len(built)) == 1
    assert per_step(block, "k", lambda g: built.append(1) or len(built)) == 2
    begin_step(block)
    assert per_step(block, "k", lambda g: 7) == 7 and per_step(block, "k", lambda g: 8) == 7
    begin_step(block)
    assert per_step(block, "k", lambda g: 9) == 9
