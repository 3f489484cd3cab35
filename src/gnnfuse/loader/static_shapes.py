"""Batches padded to fixed shapes, so a CUDA graph of the training step can replay them.

A mini-batch training step is bound by the host: on products-sized GraphSAGE (3 x 256,
fanouts 15,10,5, 1024 seeds) its Python and launches took 6.6 ms per step on an H100
against 2.7 ms of device work. A CUDA graph replays a whole step in one launch, but only
on the memory and shapes it was captured with, and every sampled batch has other sizes.
With ``NeighborLoader(..., static_shapes=True)`` each batch is padded to capacities fixed
for the loader's lifetime (`Capacities`): every vertex level to one row count, every
block to one edge count, so every tensor the step reads has the same shape in every
batch and `training.captured_step` copies each batch into the captured one's tensors.

Padding must not change the step's numbers. A padded block (`pad_block`) keeps the real
vertices and edges where they were and adds:

- padded sources after the real ones, whose features are zeros (a deferred batch's
  step gathers the first seed's row for them, which the loss reads anyway), not some
  vertex's row: vertex 0's, which they once held, can be inf or NaN, and met the padded
  rows' zero gradients in the weight gradients (``0 * inf`` in ``x^T g``) even in
  batches that never reach vertex 0; and padded destinations after the real ones;
- padded edges, each from a padded source to a padded destination, spread over them
  (a destination holds about ``edges / destinations`` of them, so no row outgrows the
  rest), and kept in destination order, so the CSR, the reverse CSR and the edge list
  agree whatever a kernel walks.

No real edge reads a padded row, and the padded destinations of one block are the
padded sources of the next, so padded rows only ever feed padded rows: the loss, which
ignores the padded seeds (label ``IGNORE_LABEL``, cross-entropy's ``ignore_index``), is
the same, and every gradient reaching a padded row is zero. That holds for layers that
compute each row from its own in-edges and its own row (every `gnnfuse.nn` conv); an
op that mixes rows (batch normalisation, a pooled readout) would see the padded rows,
which is why `training.captured_step` refuses models holding one. Each level keeps at
least one padded row (capacities are strict upper bounds), so the padded edges always
have rows to go to; a batch that does not fit is handed back unpadded.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from ..graph import Graph
from ..graph.fixed_shape import prefill_grouping
from .layouts import prepare_layouts, tensors_in
from .sampler import SampledBlock

if TYPE_CHECKING:
    from .batch_maker import MiniBatch

IGNORE_LABEL = -100        # torch.nn.functional.cross_entropy's default ignore_index
# Capacities above the largest batch probed. Products-sized batches (1024 seeds, fanouts
# 15,10,5) varied by under 1% in their level sizes (input level 463-468k rows), and a
# batch over the capacities still trains, unpadded and eagerly; every padded row costs
# its share of the step's device time.
HEADROOM = 0.04
MARGIN = 64                # rows or edges added to every capacity (and at least one padded row)
ROUND = 128                # capacities rounded up to a multiple of this


@dataclass(frozen=True)
class Capacities:
    """Row counts per vertex level and edge counts per hop, in sampling order:
    ``nodes[0]`` for the seeds, ``nodes[i + 1]`` for the sources of hop ``i`` (the
    vertices whose features the batch reads are ``nodes[-1]``), ``edges[i]`` for hop
    ``i``'s sampled edges. A batch fits when each count is below its capacity (strictly
    for rows: each level keeps a padded row)."""
    nodes: tuple[int, ...]
    edges: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.edges) + 1 or min(self.nodes + self.edges, default=0) < 1:
            raise ValueError(f"capacities need one more vertex level than hops, all positive; got nodes "
                             f"{self.nodes}, edges {self.edges}")

    @classmethod
    def covering(cls, sizes: Sequence[tuple[Sequence[int], Sequence[int]]], headroom: float = HEADROOM,
                 margin: int = MARGIN) -> "Capacities":
        """Capacities above every (nodes, edges) count in ``sizes`` (probed batches),
        with ``headroom`` and ``margin`` to spare for the batches not probed."""
        if not sizes:
            raise ValueError("capacities need at least one probed batch")

        def above(counts: Sequence[int]) -> int:
            return _round_up(math.ceil(max(counts) * (1 + headroom)) + margin)
        levels, hops = len(sizes[0][0]), len(sizes[0][1])
        return cls(tuple(above([s[0][k] for s in sizes]) for k in range(levels)),
                   tuple(above([s[1][k] for s in sizes]) for k in range(hops)))

    def fits(self, num_seeds: int, hops: Sequence[SampledBlock]) -> bool:
        """Whether a batch of ``num_seeds`` seeds and these sampled hops fits (host counts only)."""
        nodes, edges = batch_sizes(num_seeds, hops)
        return all(n < cap for n, cap in zip(nodes, self.nodes)) and all(e <= cap for e, cap in zip(edges, self.edges))


def batch_sizes(num_seeds: int, hops: Sequence[SampledBlock]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(rows per vertex level, edges per hop) of a sampled batch, as `Capacities` orders them."""
    return ((num_seeds, *(hop.nodes.numel() for hop in hops)), tuple(hop.local_src.numel() for hop in hops))


def _round_up(count: int) -> int:
    return -(-count // ROUND) * ROUND


def pad_block(hop: SampledBlock, num_src: int, num_dst: int, num_edges: int, engine: str | None = None
              ) -> SampledBlock:
    """``hop`` (on its device) padded to ``num_src`` sources, ``num_dst`` destinations and
    ``num_edges`` edges as the module doc describes; host counts only, no sync. ``eid``
    (positions in the sampled graph's CSR, which no block reads) stays unpadded.
    ``unread_dst`` becomes ``num_dst`` long: the real unread destinations, then the last
    padded source repeated (the rows a combine-first layer skips in its weight gradient;
    a padded row's gradient is zero, so skipping it changes nothing). ``engine``:
    ``"triton"`` (the default for CUDA tensors) writes all of it in one kernel
    (`pad_triton`), ``"torch"`` (elsewhere) in torch ops; the arrays are the same."""
    real_dst, real_edges, real_src = hop.rowptr.numel() - 1, hop.local_src.numel(), hop.nodes.numel()
    if not (real_dst < num_dst and real_src < num_src and real_edges <= num_edges):
        raise ValueError(f"a block of {real_src} sources, {real_dst} destinations and {real_edges} edges does not "
                         f"fit {num_src} / {num_dst} / {num_edges} (each level keeps a padded row)")
    device = hop.rowptr.device
    extra, spare_dst, spare_src = num_edges - real_edges, num_dst - real_dst, num_src - real_src
    most = max(hop.max_out_degree, -(-extra // spare_src))
    if (engine or ("triton" if device.type == "cuda" else "torch")) == "triton":
        return _pad_block_triton(hop, num_src, num_dst, num_edges)._replace(max_out_degree=most)
    k = torch.arange(extra, device=device)
    j = torch.arange(spare_dst + 1, device=device)
    rowptr = torch.cat([hop.rowptr[:-1], real_edges + (j * extra + spare_dst - 1) // spare_dst]).to(hop.rowptr.dtype)
    local_src = torch.cat([hop.local_src, (real_src + k % spare_src).to(hop.local_src.dtype)])
    dst = torch.cat([hop.dst, (real_dst + (k * spare_dst) // max(extra, 1)).to(hop.dst.dtype)])
    m = torch.arange(spare_src, device=device)
    out_degrees = torch.cat([hop.out_degrees, ((extra - m + spare_src - 1) // spare_src).to(hop.out_degrees.dtype)])
    nodes = torch.cat([hop.nodes, hop.nodes.new_zeros(spare_src)])
    unread = torch.cat([hop.unread_dst, hop.unread_dst.new_full((num_dst - hop.unread_dst.numel(),), num_src - 1)])
    return SampledBlock(rowptr, local_src, dst, hop.eid, nodes, out_degrees, most, unread, hop.earlier_edges)


def _pad_block_triton(hop: SampledBlock, num_src: int, num_dst: int, num_edges: int) -> SampledBlock:
    import triton

    from ..backend.triton.launch import launch
    from .pad_triton import BLOCK, pad_block as kernel
    outs = [torch.empty(size, dtype=t.dtype, device=t.device) for size, t in (
        (num_dst + 1, hop.rowptr), (num_edges, hop.local_src), (num_edges, hop.dst), (num_src, hop.out_degrees),
        (num_src, hop.nodes), (num_dst, hop.unread_dst))]
    grid = (triton.cdiv(max(num_edges, num_src, num_dst + 1), BLOCK),)
    launch(kernel, grid, (), (hop.rowptr, hop.local_src, hop.dst, hop.out_degrees, hop.nodes, hop.unread_dst, *outs,
                              hop.rowptr.numel() - 1, hop.local_src.numel(), hop.nodes.numel(),
                              hop.unread_dst.numel(), num_dst, num_edges, num_src), {"BLOCK": BLOCK})
    rowptr, local_src, dst, out_degrees, nodes, unread = outs
    return SampledBlock(rowptr, local_src, dst, hop.eid, nodes, out_degrees, hop.max_out_degree, unread,
                        hop.earlier_edges)


def pad_rows(table: torch.Tensor | None, rows: int, fill: float | int = 0) -> torch.Tensor | None:
    """``table`` with rows of ``fill`` appended up to ``rows``."""
    if table is None or table.shape[0] == rows:
        return table
    padded = table.new_full((rows,) + tuple(table.shape[1:]), fill)
    padded[:table.shape[0]] = table
    return padded


# --- deferred batches: the feature rows and the kernels' layouts built by the step -------
DERIVED_KEYS = "static_shapes_derived"     # cache entry: the keys `build_layouts` added


def complete(batch: "MiniBatch", features: torch.Tensor, x: torch.Tensor | None = None) -> "MiniBatch":
    """A ``deferred`` batch (``NeighborLoader(static_shapes=True, deferred=True)``) made
    whole: its feature rows ``features[n_id]`` (written into ``x`` when given) and its
    blocks' kernel layouts (`build_layouts`). Sync-free and on fixed shapes, so a captured
    step can do it: `training.BlockStepCapture` runs it inside the CUDA graph, where the
    gather and the layouts' sorts replay as part of the step instead of running as a
    few hundred separate kernels in the loader (its worker processes' kernels time-share
    the GPU with the step)."""
    if not batch.deferred:
        return batch
    if features.device != batch.n_id.device:
        raise ValueError(f"the feature table is on {features.device} but the batch on {batch.n_id.device}; "
                         "a deferred batch gathers its rows where its ids are")
    rows = torch.index_select(features, 0, batch.n_id, out=x) if x is not None else features.index_select(0, batch.n_id)
    for block in batch.blocks:
        build_layouts(block.graph)
    return dataclasses.replace(batch, x=rows, deferred=False)


def build_layouts(graph: Graph, grouping: bool = False) -> None:
    """Build `loader.layouts` for a padded block's graph (whole-row segments), and on a
    later call rebuild them *into the tensors of the first build*: kernels' launch plans
    and a captured CUDA graph hold those tensors, so a rebuild that put new ones in the
    cache would leave them reading the first batch's layouts. ``grouping``: build the
    CSR and degrees too (a padded batch of whole graphs, whose loader builds none), and
    read every vertex as a source (whether one sends no edge is the device's to know)."""
    derived = graph._cache.get(DERIVED_KEYS, ())
    scratch = copy.copy(graph)                    # the same ids and counts, a cache of the base entries
    scratch._cache = {key: value for key, value in graph._cache.items() if key not in derived and key != DERIVED_KEYS}
    before = set(scratch._cache)
    if grouping:
        prefill_grouping(scratch)
    prepare_layouts(scratch, unread=graph.src.new_empty(0) if grouping else None, whole_rows=True)
    for key, value in scratch._cache.items():
        if key in before:
            continue
        if key not in graph._cache:
            graph._cache[key] = value
            continue
        old, new = tensors_in(graph._cache[key]), tensors_in(value)
        if [(t.shape, t.dtype) for t in old] != [(t.shape, t.dtype) for t in new]:
            raise RuntimeError(f"the rebuilt layout {key!r} has other shapes than the first build")
        copy_into(old, new)
    graph._cache[DERIVED_KEYS] = tuple(sorted(set(derived) | (set(scratch._cache) - before)))
    graph._reseal()      # the layouts it hands out, rewritten in place with the rest


def copy_into(targets: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """``targets[i].copy_(sources[i])`` for each pair, in one foreach call, each target
    once (a tensor reached twice -- a layout cached under two keys -- is one tensor)."""
    seen: set[int] = set()
    pairs = [(t, s) for t, s in zip(targets, sources) if id(t) not in seen and not seen.add(id(t))]
    if pairs:       # a layout holding no tensor (None: every row read) has nothing to copy
        torch._foreach_copy_([t for t, _ in pairs], [s for _, s in pairs])
