"""The loader's fused hop kernels (`gnnfuse.loader.hop_kernels`), both engines: Triton's
(under its interpreter on CPU tensors; on a GPU machine, on the GPU) and Numba's (CPU
tensors): the sample against the graph itself (existing, distinct in-edges; every edge
of a short row; uniform subsets), the reindex against the torch path's `reindex_slots`
on the same slots (the same block, bit for bit), and the loader choosing them."""
from __future__ import annotations

import importlib.util
import itertools
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import gnnfuse
from gnnfuse.loader import NeighborLoader
from gnnfuse.loader.hop_kernels import (FUSED_HOPS, fused_hops, hop_seed, reindex_slots_fused,
                                        sample_slots_fused)
from gnnfuse.loader.sampler import reindex_slots
from graph_strategies import graphs

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gnnfuse.loader.hop_triton import uniform_below  # noqa: E402
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RUNS = settings(max_examples=12, deadline=None, derandomize=True, database=None)
ENGINES = ["triton", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed"))]


def on(engine: str) -> str:
    """Where an engine's tensors live: Numba's on the CPU, Triton's on `DEVICE`."""
    return "cpu" if engine == "numba" else DEVICE


def full_csr(case, engine):
    csr = gnnfuse.Graph.from_edge_index(case.edge_index, case.num_nodes).csr()
    return csr.rowptr.long().to(on(engine)), csr.col.long().to(on(engine))


@st.composite
def hops(draw):
    case = draw(graphs(max_nodes=9, max_edges=30, hub_degrees=st.sampled_from([0, 12])))
    seeds = draw(st.lists(st.integers(0, case.num_nodes - 1), min_size=1, max_size=case.num_nodes, unique=True))
    return case, torch.tensor(seeds), draw(st.sampled_from([1, 2, 3, 5])), draw(st.integers(0, 2**40))


def sampled(engine, drawn):
    """A drawn hop's graph, seeds and fanout where ``engine`` runs, and its slots."""
    case, seeds, fanout, seed = drawn
    rowptr, col = full_csr(case, engine)
    seeds = seeds.to(on(engine))
    return rowptr, col, seeds, fanout, sample_slots_fused(rowptr, col, seeds, fanout, seed, engine)


def assert_same_block(ours, theirs):
    for name in ours._fields:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert (a == b) if isinstance(a, int) else torch.equal(a, b), name


@pytest.mark.parametrize("engine", ENGINES)
@RUNS
@given(drawn=hops())
def test_sampled_slots_hold_distinct_in_edges_and_short_rows_whole(engine, drawn):
    rowptr, col, seeds, fanout, slots = sampled(engine, drawn)
    num_nodes = rowptr.numel() - 1
    assert slots.width == fanout and torch.equal(slots.rowptr[1:] - slots.rowptr[:-1], slots.count)
    src, eid = slots.src.view(-1, fanout).cpu(), slots.eid.view(-1, fanout).cpu()
    for i, v in enumerate(seeds.tolist()):
        lo, hi = int(rowptr[v]), int(rowptr[v + 1])
        taken = int(slots.count[i])
        assert taken == min(hi - lo, fanout)
        picked = eid[i, :taken].tolist()
        assert len(set(picked)) == taken and all(lo <= e < hi for e in picked), "not distinct in-edges"
        if hi - lo <= fanout:
            assert sorted(picked) == list(range(lo, hi)), "a row within the fanout must keep every in-edge"
        assert src[i, :taken].tolist() == col.cpu()[picked].tolist()
        assert (src[i, taken:] == num_nodes).all() and not slots.valid.view(-1, fanout)[i, taken:].any()


@pytest.mark.parametrize("engine", ENGINES)
@RUNS
@given(drawn=hops())
def test_reindex_is_the_torch_paths_block_for_the_same_slots(engine, drawn):
    """The same block, ``earlier_edges`` included (the edges into the first half of the
    seeds, as if an earlier hop had expanded those: what PyG's ``edge_index`` is cut by)."""
    rowptr, _, seeds, _, slots = sampled(engine, drawn)
    earlier = seeds.numel() // 2
    block = reindex_slots_fused(seeds, slots, rowptr.numel() - 1, engine, reached_before=earlier)
    assert_same_block(block, reindex_slots(seeds, slots, rowptr.numel() - 1, reached_before=earlier))
    assert block.earlier_edges == int(slots.rowptr[earlier])


@pytest.mark.parametrize("engine", ENGINES)
def test_reindex_numbers_by_first_occurrence_across_many_collisions(engine):
    """A few hundred distinct ids drawn into thousands of slots: long probe runs in the
    table and many duplicates per key, still the torch path's numbering."""
    generator = torch.Generator().manual_seed(3)
    num_nodes, fanout = 5000, 8
    seeds = torch.randperm(num_nodes, generator=generator)[:300]
    src = torch.randint(0, 400, (300 * fanout,), generator=generator)
    count = torch.randint(0, fanout + 1, (300,), generator=generator)
    valid = (torch.arange(fanout).unsqueeze(0) < count.unsqueeze(1)).flatten()
    src = torch.where(valid, src, num_nodes)
    rowptr = torch.cat([torch.zeros(1, dtype=torch.int64), count.cumsum(0)])
    from gnnfuse.loader.sampler import Slots
    device = on(engine)
    slots = Slots(src.to(device), torch.arange(src.numel(), device=device), valid.to(device), count.to(device),
                  rowptr.to(device), fanout)
    assert_same_block(reindex_slots_fused(seeds.to(device), slots, num_nodes, engine),
                      reindex_slots(seeds.to(device), slots, num_nodes))


@pytest.mark.parametrize("engine", ENGINES)
def test_sampling_draws_uniform_subsets(engine):
    """A row of 6 in-edges sampled 3 at a time, 2,000 times (one destination per
    draw): each of the 20 subsets about 100 times (chi-square, 19 degrees of freedom,
    p = 0.001 cut-off 43.8), and another seed draws other subsets."""
    degree, fanout, rows = 6, 3, 2000
    device = on(engine)
    rowptr = torch.tensor([0, degree], device=device)
    col = torch.arange(degree, device=device)
    seeds = torch.zeros(rows, dtype=torch.int64, device=device)
    picked = sample_slots_fused(rowptr, col, seeds, fanout, 11, engine).eid.view(rows, fanout).cpu()
    subsets = list(itertools.combinations(range(degree), fanout))
    counts = dict.fromkeys(subsets, 0)
    for row in picked.tolist():
        counts[tuple(sorted(row))] += 1
    expected = rows / math.comb(degree, fanout)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 43.8, counts
    again = sample_slots_fused(rowptr, col, seeds, fanout, 12, engine).eid.view(rows, fanout).cpu()
    assert not torch.equal(picked, again)


@triton.jit
def draws(out, bound, N: tl.constexpr):
    """``N`` draws of `uniform_below`, to read its range."""
    offsets = tl.arange(0, N)
    tl.store(out + offsets, uniform_below(5, offsets, bound))


def test_triton_draws_reach_offsets_past_32_bits():
    """A hop's in-edge offsets were one 32-bit Philox word modulo the degree: a hub's
    in-edges past 2^32 were never drawn, and at 10^8 in-edges some had 43/42 of the
    others' chance (what the torch path's `sampler.uniform_below` fixed on its side)."""
    out = torch.empty(1024, dtype=torch.int64, device=DEVICE)
    for bound in (2**40 + 3, 2**61 + 1, 7):
        draws[(1,)](out, bound, N=1024)
        assert 0 <= out.min() and out.max() < bound, bound
        assert out.unique().numel() > 1000 if bound > 2**32 else out.unique().numel() == bound
    draws[(1,)](out, 2**40 + 3, N=1024)
    assert (out >= 2**32).float().mean() > 0.9      # 255/256 of the range lies past 2^32


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
@pytest.mark.parametrize("rowptr, seeds, where", [
    ([0, 2, 9], [1], r"vertex 1, is not a row .*\(row pointers 2\.\.9\)"),     # past the 3 column entries
    ([0, 2, 1], [1], r"vertex 1, is not a row"),                                 # a row of negative length
    ([0, 2, 3], [0, 5], r"destination 1 of the hop, vertex 5, is not a row of the sampling CSR \(2 rows"),
])
def test_the_numba_sample_refuses_rows_it_would_read_out_of_bounds(rowptr, seeds, where):
    """Numba checks no bounds: a bad row would read past the arrays, so the kernel
    checks every row it reads and the caller names it."""
    with pytest.raises(IndexError, match=where):
        sample_slots_fused(torch.tensor(rowptr), torch.tensor([0, 1, 0]), torch.tensor(seeds), 2, 1, "numba")


def test_hop_seeds_differ_by_batch_and_hop_and_repeat():
    first = torch.Generator().manual_seed(5)
    seeds = {hop_seed(first, hop) for hop in range(3)} | {hop_seed(torch.Generator().manual_seed(6), 0)}
    assert len(seeds) == 4 and hop_seed(torch.Generator().manual_seed(5), 1) == hop_seed(first, 1)


def test_neighbouring_batches_draw_independent_samples(monkeypatch):
    """`hop_seed` added the hop to the batch's seed, and consecutive batches' seeds are
    one Weyl step apart (`batch_generator`), so batch i's second hop and batch i+1's
    first had one counter key: each batch's seed took, within its row, the very offsets
    the previous batch's seed had taken at its second hop (39 of 39 pairs here; a
    3-subset of 30 repeats by chance once in 4060)."""
    monkeypatch.setenv(FUSED_HOPS, "1")
    n, deg = 40, 30
    dst = torch.arange(n).repeat_interleave(deg)
    graph = gnnfuse.Graph((dst + torch.arange(1, deg + 1).repeat(n)) % n, dst, n)    # v's sources v+1..v+deg

    def offsets(block) -> list[int]:
        """The first destination's sampled sources, as offsets from it."""
        src, dst = block.edge_index
        ids = block.src_nodes
        return sorted(((ids[src[dst == 0]] - ids[0]) % n).tolist())
    torch.manual_seed(0)
    batches = list(NeighborLoader(graph, [3, 3], batch_size=1, prefetch=0))
    repeats = sum(offsets(a.blocks[0]) == offsets(b.blocks[-1]) for a, b in zip(batches, batches[1:]))
    assert repeats <= 2, f"{repeats} of {len(batches) - 1} batches repeat the previous batch's second-hop draws"


def test_the_choice_follows_the_device_and_the_switch(monkeypatch):
    monkeypatch.delenv(FUSED_HOPS, raising=False)
    has_numba = importlib.util.find_spec("numba") is not None
    assert fused_hops(torch.device("cuda"), 5, False) and fused_hops(torch.device("cpu"), 5, False) == has_numba
    assert not fused_hops(torch.device("cuda"), -1, False) and not fused_hops(torch.device("cuda"), 5, True)
    monkeypatch.setenv(FUSED_HOPS, "0")
    assert not fused_hops(torch.device("cuda"), 5, False)
    monkeypatch.setenv(FUSED_HOPS, "1")
    assert fused_hops(torch.device("cpu"), 5, False)
    assert not fused_hops(torch.device("cuda"), 15, False, rows=2**27), "positions past 32 bits"


@pytest.mark.parametrize("value", ["false", "off", "no", "2"])
def test_a_switch_value_other_than_0_1_or_auto_is_refused(monkeypatch, value):
    """``GNNFUSE_FUSED_HOPS=false`` meant auto (the kernels on a GPU or with Numba), whose
    draws differ from the torch path's the user asked for, without a word."""
    monkeypatch.setenv(FUSED_HOPS, value)
    with pytest.raises(ValueError, match=rf"GNNFUSE_FUSED_HOPS must be 0 .*, got '{value}'"):
        fused_hops(torch.device("cpu"), 5, True)
    monkeypatch.setenv(FUSED_HOPS, "auto")
    assert fused_hops(torch.device("cuda"), 5, False)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_graph_without_edges_and_a_hop_without_destinations(engine):
    device = on(engine)
    rowptr = torch.zeros(5, dtype=torch.int64, device=device)
    col = torch.zeros(0, dtype=torch.int64, device=device)
    seeds = torch.tensor([3, 0], device=device)
    slots = sample_slots_fused(rowptr, col, seeds, 4, 7, engine)
    block = reindex_slots_fused(seeds, slots, 4, engine)
    assert slots.count.tolist() == [0, 0] and block.local_src.numel() == 0
    assert block.nodes.tolist() == [3, 0] and block.unread_dst.tolist() == [0, 1]
    none = seeds[:0]
    empty = reindex_slots_fused(none, sample_slots_fused(rowptr, col, none, 4, 7, engine), 4, engine)
    assert empty.nodes.numel() == 0 and empty.rowptr.tolist() == [0] and empty.max_out_degree == 0


def test_an_engine_is_named_and_numba_takes_cpu_tensors_only():
    rowptr, col, seeds = torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0])
    with pytest.raises(ValueError, match="unknown hop engine 'cuda'"):
        sample_slots_fused(rowptr, col, seeds, 2, 1, engine="cuda")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="run on CPU tensors"):
            sample_slots_fused(rowptr.cuda(), col.cuda(), seeds.cuda(), 2, 1, engine="numba")


def test_data_parallel_ranks_take_the_kernels_unless_switched_off(monkeypatch):
    import torch.distributed as dist
    monkeypatch.delenv(FUSED_HOPS, raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    assert fused_hops(torch.device("cuda"), 5, False)
    monkeypatch.setenv(FUSED_HOPS, "0")
    assert not fused_hops(torch.device("cuda"), 5, False)


@pytest.mark.parametrize("fanouts", [[3, 2], [-1, 2]])
def test_the_loader_on_fused_hops_gives_blocks_that_chain(monkeypatch, fanouts):
    """Every hop with a fanout through the kernels (forced on this device): the blocks
    chain (each block's destinations are the next one's sources), their edges are edges
    of the graph, and the seeds come first."""
    monkeypatch.setenv(FUSED_HOPS, "1")
    generator = torch.Generator().manual_seed(0)
    num_nodes = 40
    edge_index = torch.randint(0, num_nodes, (2, 200), generator=generator)
    graph = gnnfuse.Graph.from_edge_index(edge_index, num_nodes).to(DEVICE)
    loader = NeighborLoader(graph, fanouts, batch_size=8, shuffle=True, prefetch=0, device=DEVICE)
    edges = set(zip(edge_index[0].tolist(), edge_index[1].tolist()))
    for batch in loader:
        for outer, inner in zip(batch.blocks, batch.blocks[1:]):
            assert torch.equal(outer.src_nodes[:outer.num_dst], inner.src_nodes)
        for block in batch.blocks:
            src, dst = block.edge_index
            pairs = zip(block.src_nodes[src].tolist(), block.src_nodes[dst].tolist())
            assert all(pair in edges for pair in pairs)
        assert torch.equal(batch.blocks[-1].src_nodes[:batch.batch_size], batch.input_id)


def test_a_hops_four_kernels_go_through_gnnfuses_launch(monkeypatch):
    """The hop kernels launch through `backend.triton.launch.launch`, which replays a
    specialization without Triton's binder once launched (the loader's thread issues
    four per hop and batch; the same block either way)."""
    import gnnfuse.backend.triton.launch as launch_module
    real, launched = launch_module.launch, []

    def counted(kernel, *args, **kwargs):
        launched.append(kernel.__name__)
        return real(kernel, *args, **kwargs)
    monkeypatch.setattr(launch_module, "launch", counted)
    rowptr, col = torch.tensor([0, 2, 3, 5]).to(DEVICE), torch.tensor([1, 2, 0, 0, 1]).to(DEVICE)
    seeds = torch.tensor([0, 2]).to(DEVICE)
    slots = sample_slots_fused(rowptr, col, seeds, 2, 7, "triton")
    block = reindex_slots_fused(seeds, slots, 3, "triton")
    assert launched == ["sample", "insert", "find_first", "emit"]
    assert_same_block(block, reindex_slots(seeds, slots, 3))
