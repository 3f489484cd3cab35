"""Batches padded to fixed shapes (`loader.static_shapes`) and mini-batch steps replayed
from a CUDA graph (`training.captured_step`).

The padding's contract is that it changes no number: properties of `pad_block` on
random hops, then losses and every gradient of padded against plain batches (float64,
block models on the reference and CPU backends). The capture's bookkeeping runs on the
CPU with a stand-in graph that records without running the step and replays by running
it (as a CUDA graph's kernels rewrite its memory); the GPU check is
benchmarks/check_captured_minibatch.py."""
from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import gnnfuse
from gnnfuse.data.synthetic import power_law_graph
from gnnfuse.graph.fixed_shape import is_padded, mark_padded
from gnnfuse.loader import IGNORE_LABEL, Capacities, NeighborLoader, block_graph, sample_block
from gnnfuse.loader.layouts import tensors_in
from gnnfuse.loader.static_shapes import DERIVED_KEYS, complete, pad_block
from gnnfuse.nn.block_models import build_block_model
from gnnfuse.nn.padded_loops import padded_looped
from gnnfuse.runtime.cuda_graph import CaptureFallbackWarning, audit_step
from gnnfuse.training.captured_step import BlockStepCapture, StaticBatch, row_mixing_module
from graph_strategies import graphs

RUNS = settings(max_examples=20, deadline=None, derandomize=True, database=None)


@st.composite
def padded_hops(draw):
    case = draw(graphs(max_nodes=9, max_edges=30, hub_degrees=st.sampled_from([0, 12])))
    seeds = draw(st.lists(st.integers(0, case.num_nodes - 1), min_size=1, max_size=case.num_nodes, unique=True))
    csr = gnnfuse.Graph.from_edge_index(case.edge_index, case.num_nodes).csr()
    hop = sample_block(csr.rowptr.long(), csr.col.long(), torch.tensor(seeds), draw(st.sampled_from([1, 3, -1])),
                       False, torch.Generator().manual_seed(draw(st.integers(0, 99))))
    spare = draw(st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(0, 40)))
    return hop, spare


@RUNS
@given(padded_hops())
def test_padding_keeps_the_block_and_sends_padded_edges_between_padded_rows(drawn):
    hop, (spare_src, spare_dst, extra) = drawn
    real_dst, real_src, real_edges = hop.rowptr.numel() - 1, hop.nodes.numel(), hop.local_src.numel()
    padded = pad_block(hop, real_src + spare_src, real_dst + spare_dst, real_edges + extra)
    assert torch.equal(padded.rowptr[:real_dst + 1], hop.rowptr)
    assert torch.equal(padded.local_src[:real_edges], hop.local_src) and torch.equal(padded.dst[:real_edges], hop.dst)
    assert padded.rowptr.numel() == real_dst + spare_dst + 1 and int(padded.rowptr[-1]) == real_edges + extra
    # the CSR and the edge list agree: each edge lies in its destination's row
    rows = torch.repeat_interleave(torch.arange(real_dst + spare_dst), padded.rowptr.diff())
    assert torch.equal(rows, padded.dst.long())
    assert bool((padded.local_src[real_edges:] >= real_src).all()) and bool((padded.dst[real_edges:] >= real_dst).all())
    counted = torch.bincount(padded.local_src.long(), minlength=real_src + spare_src)
    assert torch.equal(counted, padded.out_degrees) and padded.max_out_degree >= int(counted.max())
    assert torch.equal(padded.nodes[:real_src], hop.nodes) and bool((padded.nodes[real_src:] == 0).all())
    unread = padded.unread_dst
    assert unread.numel() == real_dst + spare_dst and torch.equal(unread[:hop.unread_dst.numel()], hop.unread_dst)
    assert bool((unread[hop.unread_dst.numel():] == real_src + spare_src - 1).all())


def test_a_block_that_does_not_fit_is_refused():
    csr = gnnfuse.Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3).csr()
    hop = sample_block(csr.rowptr.long(), csr.col.long(), torch.tensor([0, 1]), -1)
    with pytest.raises(ValueError, match="does not fit"):
        pad_block(hop, hop.nodes.numel(), 5, 10)          # no padded source row left


def test_capacities_cover_the_probed_sizes_and_check_their_shape():
    caps = Capacities.covering([((10, 100, 900), (120, 1500)), ((10, 130, 800), (150, 1400))])
    assert caps.nodes[1] > 130 and caps.nodes[2] > 900 and caps.edges == tuple(sorted(caps.edges))
    with pytest.raises(ValueError, match="one more vertex level"):
        Capacities((10, 20), (5, 6))


@pytest.fixture(scope="module")
def data():
    return power_law_graph(2500, 25000, 12, 5, seed=0)


def _loader(data, dtype=torch.float64, **kw):
    return NeighborLoader(data.graph, [4, 3, 3], 48, input_nodes=data.train_mask, x=data.x.to(dtype), y=data.y,
                          prefetch=0, **kw)


@pytest.mark.parametrize("model, backend", [("sage", "reference"), ("gat", "reference"), ("sage", "cpu"),
                                            ("gat", "cpu")])
def test_padded_batches_give_the_same_loss_and_gradients(data, model, backend, monkeypatch):
    pytest.importorskip("numba") if backend == "cpu" else None
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    net = build_block_model(model, 12, 5, 16, 0.0, 3).double()
    torch.manual_seed(3)
    plain = next(iter(_loader(data)))
    torch.manual_seed(3)
    loader = _loader(data, static_shapes=True)
    padded = next(iter(loader))
    assert padded.padded and padded.x.shape[0] == loader.capacities.nodes[-1] > plain.x.shape[0]
    assert bool((padded.y[padded.batch_size:] == IGNORE_LABEL).all())
    grads = []
    for batch, rows in ((plain, plain.batch_size), (padded, None)):
        net.zero_grad()
        out = net(batch.x, batch.blocks)
        loss = F.cross_entropy(out[:rows] if rows else out, batch.y)    # padded seeds: ignored labels
        loss.backward()
        grads.append([loss.detach()] + [p.grad.clone() for p in net.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_padding_reads_no_vertexs_features():
    """Padded rows once held vertex 0's features: an inf there made a padded batch's
    weight gradients NaN (the padded rows' zero gradients times inf) where the same
    batch unpadded, which never reaches vertex 0 (isolated here), is finite."""
    g = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(1, 30, (90,), generator=g), torch.randint(1, 30, (90,), generator=g), 30)
    x = torch.randn(30, 12, dtype=torch.float64, generator=g)
    x[0] = float("inf")
    y = torch.randint(0, 5, (30,), generator=g)
    torch.manual_seed(0)
    net = build_block_model("sage", 12, 5, 16, 0.0, 2).double()
    grads = []
    for static in (False, True):
        torch.manual_seed(3)
        batch = next(iter(NeighborLoader(graph, [3, 2], 8, input_nodes=torch.arange(1, 17), x=x, y=y, prefetch=0,
                                         static_shapes=static)))
        assert batch.padded == static and (static or 0 not in batch.n_id.tolist())
        net.zero_grad()
        F.cross_entropy(net(batch.x, batch.blocks)[:batch.batch_size], batch.y[:batch.batch_size]).backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    for a, b in zip(*grads):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_gatv2_on_padded_blocks_gives_the_plain_batchs_loss_and_gradients(data, backend, monkeypatch):
    """GATv2Conv builds its self loops on a padded block in fixed shapes too (`nn.padded_loops`)."""
    pytest.importorskip("numba") if backend == "cpu" else None
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    torch.manual_seed(0)
    convs = torch.nn.ModuleList([gnnfuse.nn.GATv2Conv(12, 8, heads=2), gnnfuse.nn.GATv2Conv(16, 8, heads=2),
                                 gnnfuse.nn.GATv2Conv(16, 5, heads=1)]).double()
    grads = []
    for static_shapes in (False, True):
        torch.manual_seed(3)
        batch = next(iter(_loader(data, static_shapes=static_shapes)))
        assert batch.padded == static_shapes
        h = batch.x
        for conv, block in zip(convs, batch.blocks):
            h = conv((h, h[:block.num_dst]), block.graph)
        convs.zero_grad()
        loss = F.cross_entropy(h[:batch.batch_size], batch.y[:batch.batch_size])
        loss.backward()
        grads.append([loss.detach()] + [p.grad.clone() for p in convs.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_batch_over_the_capacities_comes_unpadded(data):
    probed = _loader(data, static_shapes=True).capacities
    tight = Capacities(probed.nodes[:-1] + (8,), probed.edges)       # no batch has under 8 input rows
    batch = next(iter(_loader(data, static_shapes=tight)))
    assert not batch.padded and batch.x.shape[0] == batch.blocks[0].num_src



def test_a_batch_of_exactly_the_capacitys_rows_comes_unpadded(data):
    """Each level keeps a padded row (padded edges run between padded rows), so a batch of
    as many input rows as the capacity does not fit: it comes unpadded, as the plain batch."""
    probed = _loader(data, static_shapes=True).capacities
    torch.manual_seed(3)
    plain = next(iter(_loader(data)))
    exact = Capacities(probed.nodes[:-1] + (plain.x.shape[0],), probed.edges)
    torch.manual_seed(3)
    batch = next(iter(_loader(data, static_shapes=exact)))
    assert not batch.padded and torch.equal(batch.n_id, plain.n_id) and torch.equal(batch.x, plain.x)

class _Recorder:
    """Stands in for a CUDA graph: capture records the step without its effects (the
    model and optimizer are put back, as recording runs no kernel); replay runs it and
    writes the results into the captured outputs."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def capture(self, fn):
        saved = copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict())
        self.fn, self.out = fn, fn()
        with torch.no_grad():
            for value, kept in zip(self.model.state_dict().values(), saved[0].values()):
                value.copy_(kept)
        self.optimizer.load_state_dict(saved[1])
        return self.out

    def replay(self):
        self.out.copy_(self.fn())


def _training(data, captured: bool, model: str = "sage", step_extra=None, deferred: bool = False,
              batches: int | None = None, device: str = "cpu", **kw):
    torch.manual_seed(0)
    net = build_block_model(model, 12, 5, 16, 0.0, 3).double().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def step(batch):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(batch.x, batch.blocks)[:batch.batch_size], batch.y[:batch.batch_size])
        loss.backward()
        optimizer.step()
        if step_extra:
            step_extra(batch)
        return loss.detach()
    recorder = type("R", (_Recorder,), {"model": net, "optimizer": optimizer})
    # a deferred batch's step gathers its rows from the table on the batches' device
    loader = _loader(data, shuffle=True, static_shapes=captured, deferred=deferred, device=device,
                     feature_device="device" if deferred else None)
    run = BlockStepCapture(step, optimizers=[optimizer], modules=[net], _graph_factory=recorder,
                           features=loader.features, **kw) if captured else step
    torch.manual_seed(7)
    losses = [float(run(batch)) for batch in itertools.islice(loader, batches)]
    return losses, list(net.parameters()), run


def test_replayed_steps_train_as_eager_steps_on_plain_batches(data):
    eager, eager_params, _ = _training(data, False)
    replayed, params, run = _training(data, True)
    assert run.status == "captured" and run.replayed == len(replayed) - 4 and run.eager == 4   # 3 warm-up + last
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-9, atol=1e-12)
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_the_epochs_short_last_batch_replays_when_the_step_says_its_loss_ignores_padded_seeds(data):
    """``short_batches="replay"``: the last, smaller batch is copied into the static
    batch (its labels past its seeds are IGNORE_LABEL) and replayed, with the eager
    step's losses and weights; only the warm-up runs eagerly."""
    eager, eager_params, _ = _training(data, False)
    replayed, params, run = _training(data, True, short_batches="replay")
    assert run.status == "captured" and run.replayed == len(replayed) - 3 and run.eager == 3
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-9, atol=1e-12)
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_a_short_batch_is_loaded_only_where_nothing_but_its_seed_count_differs(data):
    batches = list(_loader(data, shuffle=True, static_shapes=True))
    last = batches[-1]
    assert last.batch_size < batches[0].batch_size
    static = StaticBatch(batches[0])
    assert "input_id" in static.load(last)                                 # the default: eager
    assert static.load(last, short=True) is None
    assert static.batch.batch_size == batches[0].batch_size               # the captured step's rows
    assert torch.equal(static.batch.input_id[:last.batch_size], last.input_id)
    assert torch.equal(static.batch.y, last.y) and bool((last.y[last.batch_size:] == IGNORE_LABEL).all())
    other = dataclasses.replace(last, y=last.y[:-1])                     # another difference as well
    assert "y" in str(static.load(other, short=True))
    # a float y's padded seeds hold -100.0, which a regression loss reads: eager
    regression = StaticBatch(dataclasses.replace(batches[0], y=batches[0].y.double()))
    assert "float y" in str(regression.load(dataclasses.replace(last, y=last.y.double()), short=True))
    assert regression.load(dataclasses.replace(batches[1], y=batches[1].y.double()), short=True) is None
    # captured on a short batch, a fuller one would have its later seeds cut off: refused
    assert "input_id" in str(StaticBatch(last).load(batches[0], short=True))
    with pytest.raises(ValueError, match="short_batches must be one of 'eager', 'replay'"):
        BlockStepCapture(lambda batch: None, short_batches="pad")


def test_a_released_block_capture_trains_on_eagerly(data):
    """``release`` (before a data-parallel process group goes) leaves a working step."""
    _, _, run = _training(data, True)
    run.release()
    assert run._capture is None and run.status.startswith("eager: released")
    batch = next(iter(_loader(data, static_shapes=True)))
    replayed = run.replayed
    assert torch.isfinite(run(batch)) and run.replayed == replayed


def test_a_step_that_caches_on_a_block_graph_is_not_replayed(data):
    """Anything cached on the static graphs during warm-up would be replayed stale."""
    def cache_something(batch):
        batch.blocks[0].graph.cached("user_norm", lambda g: g.in_degrees().double())
    eager, _, _ = _training(data, False)
    with pytest.warns(CaptureFallbackWarning, match="user_norm"):
        replayed, _, run = _training(data, True, step_extra=cache_something)
    assert run.replayed == 0 and "user_norm" in run.status
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-9, atol=1e-12)


def test_gat_steps_on_padded_blocks_are_replayed_and_train_as_eager_steps(data):
    """GAT's self loops on a padded block are built in fixed shapes on every step
    (`nn.padded_loops`), so nothing is cached on the block's graph and the step replays."""
    eager, eager_params, _ = _training(data, False, model="gat")
    replayed, params, run = _training(data, True, model="gat")
    assert run.status == "captured" and run.replayed == len(replayed) - 4
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-9, atol=1e-12)
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@RUNS
@given(padded_hops())
def test_fixed_shape_self_loops_give_a_padded_blocks_real_rows_their_eager_in_edges(drawn):
    hop, (spare_src, spare_dst, extra) = drawn
    real_dst, real_src, real_edges = hop.rowptr.numel() - 1, hop.nodes.numel(), hop.local_src.numel()
    num_src, num_dst = real_src + spare_src, real_dst + spare_dst
    padded = pad_block(hop, num_src, num_dst, real_edges + extra)
    graph = mark_padded(block_graph(padded.rowptr, padded.local_src, padded.dst, num_src, sampled=True,
                                    out_degrees=padded.out_degrees))
    fixed, eager = padded_looped(graph), graph.remove_self_loops().add_self_loops()
    assert fixed.num_edges == graph.num_edges + min(num_dst, num_src) and is_padded(fixed)
    ours, theirs = fixed.csr(), eager.csr()
    for v in range(real_dst):       # each real row: the eager row's sources, in its order (the loop last)
        mine = ours.col[ours.rowptr[v]:ours.rowptr[v + 1]]
        assert torch.equal(mine, theirs.col[theirs.rowptr[v]:theirs.rowptr[v + 1]].to(mine.dtype))
        assert int(mine[-1]) == v and int((mine == v).sum()) == 1
    # the prefilled layouts are the ones Graph would build from the edge list
    fresh = gnnfuse.Graph(fixed.src, fixed.dst, num_dst, num_src_nodes=num_src)
    for built, wanted in ((fixed.csr(), fresh.csr()), (fixed.reverse_csr(), fresh.reverse_csr())):
        for a, b in zip(built, wanted):
            assert torch.equal(a.long(), b.long())
    assert torch.equal(fixed.in_degrees(), fresh.in_degrees()) and torch.equal(fixed.out_degrees(), fresh.out_degrees())


def test_models_that_normalise_over_rows_are_refused():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    assert "BatchNorm1d" in row_mixing_module([net])
    assert row_mixing_module([torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))]) is None
    with pytest.warns(CaptureFallbackWarning, match="BatchNorm1d"):     # ("auto" on a CPU: without a word)
        run = BlockStepCapture(lambda batch: None, modules=[net], mode="on")
    assert run.status.startswith("eager")


def test_a_row_mixing_model_is_refused_on_padded_blocks_not_run_on_them(data):
    """Its eager fallback ran on the padded blocks, whose padded rows entered the batch
    norm's statistics: the loss differed from the unpadded batch's, under a warning that
    said they would not be counted. (Graph batches are unpadded instead: GraphStepCapture.)"""
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(12)).double()

    def step(batch):
        return F.cross_entropy(net(batch.x)[:batch.batch_size, :5], batch.y[:batch.batch_size])
    with pytest.warns(CaptureFallbackWarning, match="BatchNorm1d"):
        run = BlockStepCapture(step, modules=[net], mode="on")
    assert torch.isfinite(run(next(iter(_loader(data)))))
    for run in (run, BlockStepCapture(step, modules=[net], mode="off")):
        with pytest.raises(ValueError, match="BatchNorm1d.*padded rows.*static_shapes=False"):
            run(next(iter(_loader(data, static_shapes=True))))


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_row_mixing_model_left_out_of_modules_is_refused_on_padded_blocks(data, mode):
    """The refusal read only ``modules=``: a step whose BatchNorm was not passed there
    ran (eagerly here, replayed on a GPU) with the padded rows in its statistics and no
    word. The first padded batch's step now refuses it as its first call reaches it,
    before any weight moves; ``F.batch_norm`` with batch statistics likewise."""
    net = torch.nn.Sequential(torch.nn.BatchNorm1d(12)).double()

    def step(batch):
        return F.cross_entropy(net(batch.x)[:batch.batch_size, :5], batch.y[:batch.batch_size])

    def functional(batch):
        return F.cross_entropy(F.batch_norm(batch.x, None, None, training=True)[:batch.batch_size, :5],
                               batch.y[:batch.batch_size])
    for fn, name in ((step, "BatchNorm1d"), (functional, "batch_norm")):
        run = BlockStepCapture(fn, mode=mode)
        with pytest.raises(ValueError, match=f"{name}.*padded rows.*static_shapes=False"):
            run(next(iter(_loader(data, static_shapes=True))))
        assert torch.isfinite(run(next(iter(_loader(data)))))      # unpadded batches still run


def test_a_static_batch_refuses_a_batch_of_another_shape(data):
    loader = _loader(data, shuffle=True, static_shapes=True)
    batches = list(loader)
    static = StaticBatch(batches[0])
    assert static.load(batches[1]) is None
    assert torch.equal(static.batch.x, batches[1].x) and static.batch.x.data_ptr() != batches[1].x.data_ptr()
    assert "input_id" in static.load(batches[-1])            # the smaller last batch
    with pytest.raises(ValueError, match="padded batch"):
        StaticBatch(next(iter(_loader(data))))


def test_the_audit_ignores_another_threads_synchronisations():
    """A loader's prefetch thread reading a count back during the audited step is not the step's."""
    started, done = threading.Event(), threading.Event()

    def other_thread():
        started.wait()
        warnings.warn("called a synchronizing CUDA operation (another thread)", UserWarning)
        done.set()
    thread = threading.Thread(target=other_thread)
    thread.start()

    def step():
        started.set()
        done.wait()
        return torch.ones(2) * 2
    _, reason = audit_step(step, torch.device("cpu"))
    thread.join()
    assert reason is None

    def syncing_step():
        warnings.warn("called a synchronizing CUDA operation (this thread)", UserWarning)
        return torch.ones(2)
    _, reason = audit_step(syncing_step, torch.device("cpu"))
    assert reason is not None and "this thread" in reason


def test_a_deferred_batch_completes_to_the_padded_one(data):
    """Its feature rows and layouts, built later (in the step), are the loader's own."""
    torch.manual_seed(3)
    whole = next(iter(_loader(data, static_shapes=True)))
    loader = _loader(data, static_shapes=True, deferred=True)
    torch.manual_seed(3)
    deferred = next(iter(loader))
    assert deferred.deferred and deferred.x is None
    done = complete(deferred, loader.features)
    assert not done.deferred and torch.equal(done.x, loader.features[deferred.n_id])
    torch.manual_seed(3)
    real = next(iter(_loader(data))).n_id.numel()
    assert torch.equal(done.x[:real], whole.x[:real]) and not whole.x[real:].any()
    assert bool((deferred.n_id[real:] == deferred.n_id[0]).all())    # padded rows: the first seed's
    for a, b in zip(whole.blocks, done.blocks):
        keys = set(a.graph._cache)
        assert keys == set(b.graph._cache) - {DERIVED_KEYS}
        for key in keys:
            assert all(torch.equal(s, t) for s, t in zip(tensors_in(a.graph._cache[key]), tensors_in(b.graph._cache[key])))
    first = [t.data_ptr() for block in done.blocks for key in sorted(block.graph._cache)
             for t in tensors_in(block.graph._cache[key])]
    again = complete(dataclasses.replace(done, deferred=True), loader.features)      # rebuilt in place
    assert first == [t.data_ptr() for block in again.blocks for key in sorted(block.graph._cache)
                     for t in tensors_in(block.graph._cache[key])]


def test_deferred_batches_need_static_shapes_on_the_device(data):
    with pytest.raises(ValueError, match="static_shapes"):
        _loader(data, deferred=True)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_labels_that_cannot_hold_the_ignored_label_are_refused(dtype):
    """A padded batch's labels past its seeds are IGNORE_LABEL (-100): a bool ``y`` held
    True there and a uint8 one 156, labels a replayed short batch's loss read as real."""
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    y = torch.tensor([0, 1, 1, 0]).to(dtype)
    with pytest.raises(ValueError, match=f"cannot pad a {dtype} y: .* a real label; give int64 labels"):
        NeighborLoader(gnnfuse.Graph.from_edge_index(edge_index, 4), [1], 2, y=y, prefetch=0, static_shapes=True)
    NeighborLoader(gnnfuse.Graph.from_edge_index(edge_index, 4), [1], 2, y=y, prefetch=0)     # unpadded: as given


def test_given_capacities_must_have_one_entry_per_hop(data):
    with pytest.raises(ValueError, match="2 hops but num_neighbors samples 3"):
        _loader(data, static_shapes=Capacities((64, 512, 2048), (256, 4096)))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_replayed_steps_on_deferred_batches_train_as_eager_steps(data, backend, monkeypatch):
    if backend == "cpu":
        pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    eager, eager_params, _ = _training(data, False)
    replayed, params, run = _training(data, True, deferred=True)
    assert run.status == "captured" and run.replayed == len(replayed) - 4
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-9, atol=1e-12)
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_the_audit_keeps_the_steps_warnings_but_not_the_debug_modes_notice():
    def step():
        warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                      "synchronizing operations", UserWarning)
        warnings.warn("the step's own warning", UserWarning)
        return torch.ones(1)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        audit_step(step, torch.device("cpu"))
    assert [str(w.message) for w in shown] == ["the step's own warning"]


def test_worker_processes_send_the_same_deferred_batches(data):
    """A deferred batch crosses the process boundary without x and layouts, and completes
    to what the in-process loader's batch completes to."""
    batches = {}
    for workers in (0, 1):
        loader = _loader(data, static_shapes=True, deferred=True, num_workers=workers, shuffle=True)
        torch.manual_seed(11)
        batches[workers] = [complete(b, loader.features) for b in loader][:3]
        loader.close()
    for a, b in zip(batches[0], batches[1]):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        for block_a, block_b in zip(a.blocks, b.blocks):
            assert set(block_a.graph._cache) == set(block_b.graph._cache)
            for key in block_a.graph._cache:
                assert all(torch.equal(s, t) for s, t in zip(tensors_in(block_a.graph._cache[key]),
                                                              tensors_in(block_b.graph._cache[key])))


def test_a_batch_that_is_not_a_mini_batch_runs_its_step_eagerly_as_given():
    """The class doc's promise: a link batch, a PyG Data or any other object is not padded,
    so the step runs on it as given (it read ``batch.padded`` and raised AttributeError)."""
    from torch_geometric.data import Data
    seen = []
    step = BlockStepCapture(lambda batch: seen.append(batch) or torch.tensor(1.0), mode="auto")
    for batch in (Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]])), {"x": 1}, object()):
        assert float(step(batch)) == 1.0 and seen[-1] is batch
    assert step.eager == 3 and step.replayed == 0


def test_mode_on_says_once_that_unpadded_batches_run_eagerly(data):
    """Asked to capture, a loop over unpadded batches ran every step eagerly without a word,
    its status 'warming up' forever."""
    step = BlockStepCapture(lambda batch: torch.tensor(0.0), mode="on")
    loader = _loader(data, static_shapes=False)
    with pytest.warns(CaptureFallbackWarning, match="not padded.*static_shapes=True") as caught:
        for batch in itertools.islice(loader, 3):
            step(batch)
    assert len([w for w in caught if issubclass(w.category, CaptureFallbackWarning)]) == 1
    assert step.status.startswith("eager so far: its batch is not padded") and step.eager == 3
    quiet = BlockStepCapture(lambda batch: torch.tensor(0.0), mode="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        quiet(next(iter(loader)))
