"""A training step on the loader's blocks reads nothing back from the device.

Every block is a new graph; whatever a layer or backend derives from it with a
host-visible size (a nonzero, a bincount, a maximum) would be a GPU sync in the middle
of the step, once per layer and batch. The loader builds all of that in its own thread
(`loader.layouts`), so the step's forward and backward must issue no syncing op at all:
counted here on the CPU with `HostSyncCounter`, on both backends."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

import gnnfuse
from gnnfuse.bench.host_syncs import HostSyncCounter
from gnnfuse.loader import NeighborLoader
from gnnfuse.nn.block_models import build_block_model
from graph_strategies import graphs
from layout_builds import STEP_BUILDS, watch_builds


def _graph_and_model(device: str, kind: str = "sage"):
    generator = torch.Generator().manual_seed(0)
    graph = gnnfuse.Graph(torch.randint(0, 50, (400,), generator=generator),
                          torch.randint(0, 50, (400,), generator=generator), 50).to(device)
    torch.manual_seed(0)
    # SAGE: 8 -> 8 aggregates first; 8 -> 3 narrows, so it maps first (`_transform_first`'s rows)
    model = build_block_model(kind, 8, 3, 8, 0.5 if kind == "sage" else 0.0, 2).to(device)
    return graph, model


def _triton_loader(monkeypatch, kind: str = "sage"):
    """(model, loader) on the Triton backend (the interpreter on a CPU-only machine),
    the loader over `_graph_and_model`'s graph, no prefetch."""
    from oracle_check import device_for
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    graph, model = _graph_and_model(device, kind)
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, x=torch.randn(50, 8, device=device),
                            y=torch.randint(0, 3, (50,), device=device), prefetch=0)
    return model, loader


def _counted_steps(model, batches, backend: str, monkeypatch) -> HostSyncCounter:
    counter = HostSyncCounter()
    if backend == "triton":     # the interpreter runs kernels on the host: leave the launch out
        from gnnfuse.backend.triton import executor
        launch = executor.launch

        def paused_launch(*args, **kwargs):
            with counter.paused():
                launch(*args, **kwargs)
        monkeypatch.setattr(executor, "launch", paused_launch)
    with counter:
        for batch in batches:
            F.cross_entropy(model(batch.x, batch.blocks), batch.y).backward()
    return counter


def test_a_training_step_on_loader_blocks_makes_no_host_sync(backend, device, monkeypatch):
    graph, model = _graph_and_model(device)
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, x=torch.randn(50, 8, device=device),
                            y=torch.randint(0, 3, (50,), device=device), prefetch=0)
    first, *batches = [batch for _, batch in zip(range(3), loader)]
    F.cross_entropy(model(first.x, first.blocks), first.y).backward()      # traces and compiles
    counter = _counted_steps(model, batches, backend, monkeypatch)
    assert counter.ops, "the counter saw no op at all"
    assert not counter.syncs, f"host syncs in the step: {dict(counter.syncs)}"


def test_gat_on_loader_blocks_makes_no_host_sync_once_the_loader_knows_it_wants_self_loops(backend, device,
                                                                                          monkeypatch):
    """GATConv adds self loops: a new graph per block, whose building and layouts read
    counts back. The first step asks for it (and syncs); blocks the loader makes after
    that come with it, and their steps issue no syncing op. Blocks made before the
    first step (the first three here) still sync, which shows the counter would see it."""
    graph, model = _graph_and_model(device, "gat")
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, x=torch.randn(50, 8, device=device),
                            y=torch.randint(0, 3, (50,), device=device), prefetch=0)
    first, *early = [batch for _, batch in zip(range(3), loader)]
    F.cross_entropy(model(first.x, first.blocks), first.y).backward()      # traces, compiles, asks for loops
    assert _counted_steps(model, early, backend, monkeypatch).syncs, "blocks made before the request"
    later = [batch for _, batch in zip(range(2), loader)]
    counter = _counted_steps(model, later, backend, monkeypatch)
    assert counter.ops, "the counter saw no op at all"
    assert not counter.syncs, f"host syncs in the step: {dict(counter.syncs)}"
    batch = later[0]          # the loader's looped graph and layouts give what the step's own would
    bare = [type(block)(gnnfuse.Graph(block.graph.src, block.graph.dst, block.num_dst, num_src_nodes=block.num_src),
                        block.src_nodes) for block in batch.blocks]
    assert torch.allclose(model(batch.x, batch.blocks), model(batch.x, bare), atol=1e-6)


def test_gat_on_worker_processes_blocks_makes_no_host_sync_from_the_epoch_after_the_first_step(backend, device,
                                                                                               monkeypatch):
    """A worker's copy of the loader sees no step: which positions' self-looped graphs
    the training process's layers asked for reaches the workers with the next epoch's
    jobs (`BatchMaker.learnt`). Before, worker batches never came with them, and every
    GAT step built them, reading counts back."""
    graph, model = _graph_and_model(device, "gat")
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, x=torch.randn(50, 8, device=device),
                            y=torch.randint(0, 3, (50,), device=device), num_workers=1)
    try:
        for batch in loader:        # traces, compiles, asks for loops; the workers' blocks come without them
            F.cross_entropy(model(batch.x, batch.blocks), batch.y).backward()
        later = [batch for _, batch in zip(range(2), loader)]
    finally:
        loader.close()
    counter = _counted_steps(model, later, backend, monkeypatch)
    assert counter.ops, "the counter saw no op at all"
    assert not counter.syncs, f"host syncs in the step: {dict(counter.syncs)}"


def test_gat_on_pyg_edge_index_has_the_loader_loop_the_batchs_view_not_its_blocks():
    """A GAT over PyG's ``batch.edge_index`` asks for the self-looped graph of the
    batch's PyG view: later batches come with the view's built ahead (no sync in the
    step), and their blocks, which such a step never reads, without theirs."""
    pytest.importorskip("torch_geometric")
    from gnnfuse.nn import GAT
    graph, _ = _graph_and_model("cpu")
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, x=torch.randn(50, 8),
                            y=torch.randint(0, 3, (50,)), prefetch=0)
    torch.manual_seed(0)
    model = GAT(8, 8, 2, 3, heads=2)

    def step(batch):
        F.cross_entropy(model(batch.x, batch.edge_index)[:batch.batch_size], batch.y).backward()
    batches = iter(loader)
    for _ in range(2):          # shows the loader the idiom, then asks for the view's loops
        step(next(batches))
    batch = next(batches)
    assert all("nn_self_looped" not in block.graph._cache for block in batch.blocks)
    assert "nn_self_looped" in batch.pyg_view.graph._cache
    with HostSyncCounter() as counter:
        step(batch)
    assert counter.ops and not counter.syncs, dict(counter.syncs)


def test_the_counter_sees_the_syncs_of_a_block_without_prepared_layouts(backend, device, monkeypatch):
    """The same step on the same edges, as a graph built by hand: its layouts are built
    in the step, and the counter must see that (or the test above could not fail)."""
    graph, model = _graph_and_model(device)
    loader = NeighborLoader(graph, [4, 3], batch_size=6, x=torch.randn(50, 8, device=device),
                            y=torch.randint(0, 3, (50,), device=device), prefetch=0)
    batch = next(iter(loader))
    F.cross_entropy(model(batch.x, batch.blocks), batch.y).backward()
    bare = [type(block)(gnnfuse.Graph(block.graph.src, block.graph.dst, block.num_dst, num_src_nodes=block.num_src),
                        block.src_nodes) for block in batch.blocks]
    counter = _counted_steps(model, [type(batch)(bare, batch.x, batch.y, batch.n_id, batch.input_id)], backend,
                             monkeypatch)
    assert counter.syncs


def test_triton_segments_of_rows_that_cannot_split_are_built_without_a_sync():
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import segments
    generator = torch.Generator().manual_seed(3)
    dst = torch.randint(0, 9, (40,), generator=generator)
    graph = gnnfuse.Graph(torch.randint(0, 12, (40,), generator=generator), dst, 9, num_src_nodes=12)
    most = int(torch.bincount(dst).max())
    graph.csr()                                   # built before counting: a loader's block comes with it
    counter = HostSyncCounter()
    with counter:
        hinted = segments(GraphContext(graph), "dst", most, max_degree=most)
    assert not counter.syncs
    counted = segments(GraphContext(gnnfuse.Graph(graph.src, dst, 9, num_src_nodes=12)), "dst", most)   # counts
    # the same segments: the hinted rows are all short, so they keep CSR order (no sort)
    assert torch.equal(hinted.row, torch.arange(9, dtype=hinted.row.dtype))
    order = torch.argsort(counted.row)
    for name in ("row", "start", "end", "split"):
        ours, theirs = getattr(hinted, name), getattr(counted, name)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs[order]), name
    assert hinted.split_rows.dtype == counted.split_rows.dtype and not len(hinted.split_rows) and not len(
        counted.split_rows)


def test_triton_segments_keep_longest_first_where_a_row_may_be_long():
    """Only a bound of at most `SHORT_ROWS` keeps CSR order; a longer bound (a hop's
    larger out-degree) still sorts, so a hub's row starts first."""
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import SHORT_ROWS, segments
    dst = torch.cat([torch.zeros(SHORT_ROWS + 5, dtype=torch.long), torch.arange(1, 6)])
    graph = gnnfuse.Graph(torch.arange(dst.numel()), dst, 6, num_src_nodes=dst.numel())
    long_bound = segments(GraphContext(graph), "dst", 512, max_degree=SHORT_ROWS + 5)
    lengths = long_bound.end - long_bound.start
    assert int(lengths[0]) == SHORT_ROWS + 5 and int(long_bound.row[0]) == 0
    assert torch.equal(lengths, torch.sort(lengths, descending=True).values)
    short = gnnfuse.Graph(torch.arange(5), torch.arange(1, 6), 6, num_src_nodes=5)
    in_order = segments(GraphContext(short), "dst", 512, max_degree=1)
    assert torch.equal(in_order.row.long(), torch.arange(6))
    assert torch.equal(in_order.start.long(), short.csr()[0][:-1].long())
    assert torch.equal(in_order.end.long(), short.csr()[0][1:].long())


def test_source_side_layouts_are_built_only_when_the_step_walks_by_source(backend, device, monkeypatch):
    """The loader leaves the reverse CSR and the source segments as recipes
    (`Graph.build_later`): the first block of an aggregate-first SAGE, whose input needs
    no gradient, never gets them, and the step still syncs nowhere."""
    graph, model = _graph_and_model(device)
    loader = NeighborLoader(graph, [4, 3], batch_size=6, shuffle=True, x=torch.randn(50, 8, device=device),
                            y=torch.randint(0, 3, (50,), device=device), prefetch=0)
    first, batch = [batch for _, batch in zip(range(2), loader)]
    F.cross_entropy(model(first.x, first.blocks), first.y).backward()      # traces and compiles
    assert all("reverse_csr" not in block.graph._cache for block in batch.blocks)
    counter = _counted_steps(model, [batch], backend, monkeypatch)
    assert counter.ops and not counter.syncs, f"host syncs in the step: {dict(counter.syncs)}"
    assert "reverse_csr" not in batch.blocks[0].graph._cache, "the input layer's block was walked by source"


def test_a_loader_blocks_deferred_source_layouts_build_without_a_sync_and_equal_the_graphs_own(monkeypatch):
    """What the Triton backend's backward reads of a block's source side, built from
    the loader's recipes when first read: no sync, the same reverse CSR as the graph's
    own, and segments covering every edge once."""
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import SEGMENT_EDGES, segments
    _, loader = _triton_loader(monkeypatch)
    batch = next(iter(loader))
    assert all("reverse_csr" not in block.graph._cache for block in batch.blocks)
    for block in batch.blocks:
        counter = HostSyncCounter()
        with counter:
            reverse = block.graph.reverse_csr()
            built = segments(GraphContext(block.graph), "src", SEGMENT_EDGES)
        assert not counter.syncs, f"host syncs building a block's source side: {dict(counter.syncs)}"
        fresh = gnnfuse.Graph(block.graph.src, block.graph.dst, block.num_dst, num_src_nodes=block.num_src)
        for ours, theirs in zip(reverse, fresh.reverse_csr()):
            assert torch.equal(ours.long(), theirs.long())
        counted = segments(GraphContext(fresh), "src", SEGMENT_EDGES)
        assert torch.equal(torch.sort(built.row.long()).values, torch.sort(counted.row.long()).values)
        assert int((built.end - built.start).sum()) == block.graph.num_edges


def test_a_training_step_consumes_the_loaders_source_side_recipe_and_the_next_batches_come_with_it(monkeypatch):
    """`SourceSideDemand`: the step's backward walks the second block by source through
    `Graph.grouped` (rows without edge ids); that read must take the loader's sync-free
    recipe and mark the position, so the loader's later blocks there come with it built
    while the others keep recipes -- not sort the block's edges again in the step, as it
    did for every block of every batch (a test calling ``reverse_csr()`` in the step's
    place did not see it)."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")    # walk by source, as products-sized blocks' backward does
    model, loader = _triton_loader(monkeypatch)
    batches = iter(loader)
    first = next(batches)
    F.cross_entropy(model(first.x, first.blocks), first.y).backward()
    walked = first.blocks[1].graph
    assert "reverse_csr" in walked._cache, "the step did not take the loader's recipe"
    assert "reverse_csr_rows" not in walked._cache, "the step sorted the block's edges itself"
    later = next(batches)
    assert "reverse_csr" in later.blocks[1].graph._cache and not later.blocks[1].graph._builders
    # the input layer's block, never walked by source, keeps its recipes
    assert "reverse_csr" not in later.blocks[0].graph._cache and later.blocks[0].graph._builders


def test_a_loader_block_comes_with_its_destination_sides_split_row_table(monkeypatch):
    """A sum or mean over a block's destinations reads its segments' split-row table: the
    loader builds it with the segments, so the step makes neither of its two tensors."""
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import SEGMENT_EDGES, split_slots
    _, loader = _triton_loader(monkeypatch)
    batch = next(iter(loader))
    for block in batch.blocks:
        key = f"triton_split_slots_dst_{SEGMENT_EDGES}"
        assert key in block.graph._cache
        assert split_slots(GraphContext(block.graph), "dst", SEGMENT_EDGES) is block.graph._cache[key]


@pytest.mark.parametrize("kind", ["sage", "gat"])
@pytest.mark.parametrize("schedule", ["auto", "csr"])
def test_a_step_on_fresh_loader_blocks_builds_no_layout_the_loader_could_have_built(schedule, kind, monkeypatch):
    """Once the loader has seen what a step reads (`SourceSideDemand`), a step on a new
    batch finds every layout of its blocks built, and builds per graph only the values
    the reference executor keeps per graph (a mean's clamped degrees) and two cheap
    tables few layers read (below). A layout built in the step is host work on the
    critical path -- a sort of the block's edges ran in every step's backward until the
    step took the loader's recipe."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
    model, loader = _triton_loader(monkeypatch, kind)
    batches = iter(loader)
    for _ in range(2):        # compiles, and shows the loader which blocks the step walks by source
        batch = next(batches)
        F.cross_entropy(model(batch.x, batch.blocks), batch.y).backward()
    batch = next(batches)
    built = watch_builds(monkeypatch)
    F.cross_entropy(model(batch.x, batch.blocks), batch.y).backward()
    assert built, "the step asked its blocks for nothing: the watch saw no program run"
    assert all(key.startswith(STEP_BUILDS) for key in built), built


def test_grouped_rows_take_a_deferred_full_layout():
    """`Graph.grouped` serves from the full layout's recipe where one waits (`build_later`)."""
    from gnnfuse.graph.fixed_shape import defer_reverse_csr
    gen = torch.Generator().manual_seed(1)
    built = []
    graph = gnnfuse.Graph(torch.randint(0, 9, (40,), generator=gen), torch.randint(0, 9, (40,), generator=gen), 9)
    defer_reverse_csr(graph, lambda: built.append(True))
    rowptr, col = graph.grouped("src")
    assert built == [True] and "reverse_csr_rows" not in graph._cache
    plain = gnnfuse.Graph(graph.src.clone(), graph.dst.clone(), 9)
    want_rowptr, want_col = plain.grouped("src")
    assert torch.equal(rowptr.long(), want_rowptr.long()) and torch.equal(col.long(), want_col.long())


def test_a_graph_of_short_rows_without_a_bound_keeps_order_after_one_read_back():
    """A graph with no known bound on its rows (a new edge_index every step: batches of
    molecules) reads its longest row back once; all short, its rows keep CSR order with
    no sort, ``repeat_interleave`` or ``nonzero`` (each a read-back of its own), as a
    sampled block's do. A row past `SHORT_ROWS` still gets the counted, longest-first
    segments."""
    from gnnfuse.backend.reference import GraphContext
    from gnnfuse.backend.triton.schedule import SHORT_ROWS, segments
    from gnnfuse.bench.host_syncs import HostSyncCounter
    short = gnnfuse.Graph(torch.tensor([0, 1, 2, 3, 3]), torch.tensor([1, 2, 3, 0, 4]), 6)
    short.csr()
    with HostSyncCounter() as counter:
        in_order = segments(GraphContext(short), "dst", 512)
    assert sum(counter.syncs.values()) == 1 and "aten.sort.stable" not in counter.ops
    assert torch.equal(in_order.row.long(), torch.arange(6)) and not len(in_order.split_rows)
    assert torch.equal(in_order.start.long(), short.csr()[0][:-1].long())
    dst = torch.cat([torch.arange(1, 6), torch.zeros(SHORT_ROWS + 1, dtype=torch.long)])
    hub = gnnfuse.Graph(torch.arange(dst.numel()) % 6, dst, 6)
    counted = segments(GraphContext(hub), "dst", 512)
    assert int(counted.row[0]) == 0 and int((counted.end - counted.start)[0]) == SHORT_ROWS + 1


@settings(max_examples=15, deadline=None, derandomize=True)
@given(case=graphs(max_nodes=9, max_edges=30))
def test_a_new_graphs_degrees_and_row_pointers_read_nothing_back_on_a_gpu(case):
    """Degrees and CSR row pointers of a graph built from a plain edge list: on a GPU by
    the grouping's binary search (a ``bincount`` there reads its input's maximum back, a
    sync for every new graph of a graph-classification step), on the host by
    ``bincount``; both equal the host's counts, isolated vertices, loops and multi-edges
    included."""
    src, dst = case.given
    expected_in = torch.bincount(torch.as_tensor(dst, dtype=torch.long), minlength=case.num_nodes)
    expected_out = torch.bincount(torch.as_tensor(src, dtype=torch.long), minlength=case.num_nodes)
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        graph = gnnfuse.Graph(src, dst, case.num_nodes).to(device)
        with HostSyncCounter() as counter:
            built = (graph.in_degrees(), graph.out_degrees(), graph.csr().rowptr, graph.reverse_csr().rowptr)
        if device == "cuda":
            assert not counter.syncs, dict(counter.syncs)
        in_deg, out_deg, rowptr, reverse_rowptr = (t.long().cpu() for t in built)
        assert torch.equal(in_deg, expected_in) and torch.equal(out_deg, expected_out)
        assert torch.equal(rowptr, torch.cat([torch.zeros(1, dtype=torch.long), expected_in.cumsum(0)]))
        assert torch.equal(reverse_rowptr, torch.cat([torch.zeros(1, dtype=torch.long), expected_out.cumsum(0)]))


def test_the_counter_counts_each_op_that_returns_a_value_to_the_host():
    """``torch.allclose`` returns a Python bool, a host read of the device's result like
    ``torch.equal`` (runtime/cuda_graph.py refuses both in a captured step), but it is one
    aten op on the CPU: the counter saw no sync in it."""
    x = torch.ones(4)
    reads = {"allclose": lambda: torch.allclose(x, x), "equal": lambda: torch.equal(x, x),
             "item": lambda: x.sum().item(), "is_nonzero": lambda: torch.is_nonzero(x[:1])}
    for name, read in reads.items():
        with HostSyncCounter() as counter:
            read()
        assert sum(counter.syncs.values()) == 1, (name, dict(counter.syncs))


def test_the_counter_counts_the_syncing_ops_its_docstring_lists():
    """Each rule of `op_syncs`, by hand: ``nonzero``, a bool or uint8 mask index,
    ``repeat_interleave`` without ``output_size`` and ``tolist`` wait for the device;
    the same with ``output_size``, a sum, and anything in `paused` do not; a copy to the
    host waits unless ``non_blocking``. Only whole training steps were counted, so a rule
    dropped or widened went unseen wherever those steps happen not to use the op."""
    import types
    import warnings

    from gnnfuse.bench.host_syncs import op_syncs
    x = torch.arange(6.0)
    with HostSyncCounter() as counter, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)        # torch deprecates uint8 masks
        x.nonzero()
        x[x > 2]
        x[torch.tensor([1, 0, 1, 0, 0, 0], dtype=torch.uint8)]
        torch.repeat_interleave(torch.tensor([1, 2]))
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        x.tolist()
        x.sum()
        with counter.paused():
            x.nonzero()
    assert dict(counter.syncs) == {"aten.nonzero.default": 1, "aten.index.Tensor": 2,
                                   "aten.repeat_interleave.Tensor": 1, "Tensor.tolist": 1}
    on_gpu = types.SimpleNamespace(is_cuda=True)
    assert op_syncs("aten._to_copy.default", (on_gpu,), {"device": "cpu"})
    assert not op_syncs("aten._to_copy.default", (on_gpu,), {"device": "cpu", "non_blocking": True})
