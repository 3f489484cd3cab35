"""PyG's view of a loader batch: the sampled subgraph as PyG's ``NeighborLoader`` hands
it (``edge_index`` over ``n_id``, ``num_sampled_nodes``/``num_sampled_edges``, and
``e_id``/``edge_attr``/``edge_weight`` in its edge order), cut from the blocks on first
use, so PyG code runs unchanged on a gnnfuse batch and the block path pays nothing.

How the two layouts relate. PyG's sampler expands each vertex once: hop k samples the
in-edges of the vertices hop k - 1 added (of the seeds for hop 0), numbers the new
sources by first appearance after every vertex before them, and lists hop k's edges
after hop k - 1's, grouped by destination in the destinations' order. The blocks
number their vertices the same way (destinations first, then new sources by first
appearance), so one numbering, ``n_id``'s, holds for all of them; but hop k's block (a
layer's, DGL's layout) samples *every* vertex reached so far again. Its first
``earlier_edges`` edges (CSR order) go into vertices an earlier hop expanded, the rest
into those hop k expands first: PyG's hop k is that tail of the block's edges, and
slicing it needs only host counts the sampler read back with the hop's others (no sync).

With full neighbourhoods (``-1``) a re-sample is the earlier hop's own edges and adds no
vertex: ``n_id``, ``edge_index``, ``e_id`` and the counts are PyG's, edge for edge. With
a fanout, a vertex the re-sample alone reached is in ``n_id`` (and ``x``) too, with its
own sampled in-edges, but no edge of ``edge_index`` leads from it toward the seeds, so
no seed's output depends on it.

So PyG's subgraph comes grouped by destination too: hop k's edges go into
``[blocks' num_dst of hop k - 1, num_dst of hop k)``, in the block's CSR order, after
every earlier hop's. Its CSR is then the edge order itself and its row lengths the
blocks' (`subgraph_graph`): the `Graph` a layer would make of ``edge_index`` is built
without a sort and without reading a count or an id's range back to the host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..graph import Graph
from ..graph.index_cache import remember, remember_prefixes
from .block import Block, block_graph
from .layouts import prepare_layouts

# the batch's PyG view's position among its graphs (the blocks' are 0, 1, ..., input layer
# first), as the loader learns what steps read of each (`SourceSideDemand`,
# `nn.conv.looped_blocks_wanted`); its graph and every trimmed prefix's share it
PYG_VIEW_POSITION = -1


def refuse_padded(name: str) -> None:
    """Refuse PyG's view of a padded batch (``static_shapes``), naming the attribute."""
    raise ValueError(
        f"batch.{name}: this batch is padded to the loader's static shapes (NeighborLoader(static_shapes=...)): "
        f"its x and n_id end in padding rows that a PyG model run on the whole batch would take for vertices (a "
        f"batch norm's statistics would include them). PyG's view (edge_index, num_sampled_nodes, "
        f"num_sampled_edges, e_id, ...) comes with a loader without static_shapes; padded batches are for "
        f"block models (batch.blocks)")


def num_sampled_nodes(blocks: Sequence[Block]) -> list[int]:
    """PyG's ``num_sampled_nodes``: the seeds, then the vertices each hop added."""
    return [blocks[-1].num_dst] + [block.num_src - block.num_dst for block in reversed(blocks)]


def pyg_hop_edges(counts: Sequence[int], fanouts: Sequence[int]) -> tuple[int, ...]:
    """PyG's ``num_sampled_edges`` from each hop's count of block edges into the vertices
    that hop expands first (``counts``, seeds outward): none from the first hop of fanout 0
    on. PyG's hop k expands the vertices hop k - 1 added, none after a 0; a block samples
    every vertex reached so far again, so after a 0 a re-sample added vertices that a later
    hop expanded first, and ``[0, -1, -1]`` gave an ``edge_index`` edge (and a count) that
    PyG's batch does not have, into a vertex none of PyG's hops reached."""
    stop = next((k for k, fanout in enumerate(fanouts) if fanout == 0), len(counts))
    return tuple(count if k < stop else 0 for k, count in enumerate(counts))


def hop_tails(tables: Sequence[torch.Tensor], hop_edges: Sequence[int]) -> torch.Tensor:
    """Rows of PyG's hops from per-edge tables, one per hop seeds outward: each table's
    last ``hop_edges[k]`` rows (its block's edges into the vertices hop k expands first),
    hop 0's first."""
    return torch.cat([table[table.shape[0] - count:] for table, count in zip(tables, hop_edges)])


def subgraph_edge_index(blocks: Sequence[Block], hop_edges: Sequence[int]) -> torch.Tensor:
    """PyG's ``edge_index`` ``[2, E]`` (int64 ids into ``n_id``; row 0 the sampled
    neighbour, row 1 the vertex it was sampled for) from the blocks (input layer first)."""
    seeds_out = list(reversed(blocks))
    return torch.stack([hop_tails([block.graph.src for block in seeds_out], hop_edges),
                        hop_tails([block.graph.dst for block in seeds_out], hop_edges)]).long()


def subgraph_edge_rows(blocks: Sequence[Block], hop_edges: Sequence[int], name: str) -> torch.Tensor | None:
    """The blocks' per-edge table ``name`` (``e_id``, ``edge_attr``, ``edge_weight``) in
    ``edge_index``'s order; None where the blocks hold none."""
    tables = [getattr(block, name) for block in reversed(blocks)]
    return None if any(table is None for table in tables) else hop_tails(tables, hop_edges)


def subgraph_graph(blocks: Sequence[Block], edge_index: torch.Tensor, hop_edges: Sequence[int]) -> Graph:
    """The `Graph` of ``edge_index`` (`subgraph_edge_index`'s), with its CSR and degree
    vectors in its cache, as ``Graph.coerce(edge_index, num_nodes)`` would build them
    (module doc): its ids are the blocks' local ids, in range by construction, so they are
    not checked, and its row lengths are each hop's block's in-degrees at the vertices
    that hop expands first (zeros for a hop PyG's batch takes no edge of, `pyg_hop_edges`).
    Why: a layer given ``batch.edge_index`` made this graph in the training step, reading
    its ids' range back (a sync on a GPU) and sorting its edges."""
    num_nodes = blocks[0].num_src if blocks else 0
    rows, begin = [], 0
    for block, count in zip(reversed(blocks), hop_edges):
        degrees = block.graph.in_degrees()[begin:block.num_dst]
        rows.append(degrees if count else torch.zeros_like(degrees))
        begin = block.num_dst
    device = edge_index.device
    rows.append(torch.zeros(num_nodes - begin, dtype=torch.int64, device=device))
    rowptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), torch.cat(rows).cumsum(0)])
    # rows of a detached alias, not of ``edge_index``: a view keeps its base alive, and the
    # index cache keeps this graph while ``edge_index`` lives, so views of ``edge_index``
    # kept every batch's tensors alive until evicted (the alias shares its memory and its
    # version counter, so an edit of ``edge_index`` still shows in the graph's seal)
    src, dst = edge_index.detach().unbind(0)
    return block_graph(rowptr, src, dst, num_nodes, sampled=True, one_vertex_set=True, position=PYG_VIEW_POSITION)


def prefix_graph(graph: Graph, edges: int, num_nodes: int) -> Graph:
    """The graph of the first ``edges`` edges of ``graph`` (`subgraph_graph`'s) over its
    first ``num_nodes`` vertices, without a host read: PyG's ``trim_to_layer`` drops the
    last hops' edges and vertices layer by layer, and the edges kept are exactly those
    into the vertices the kept hops expanded (module doc), so its rows are ``graph``'s
    first ones, each cut at ``edges``."""
    rowptr = graph.csr()[0][:num_nodes + 1].long().clamp(max=edges)
    return block_graph(rowptr, graph.src[:edges], graph.dst[:edges], num_nodes, sampled=True, one_vertex_set=True,
                       position=PYG_VIEW_POSITION)


def trimmed_sizes(hop_edges: Sequence[int], hop_nodes: Sequence[int]) -> list[tuple[int, int]]:
    """(edges, vertices) of the subgraph PyG's ``trim_to_layer`` gives each layer past the
    first of a model with a layer per hop: layer ``i`` drops the last ``i`` hops' edges
    (``num_sampled_edges``) and the vertices they added (``num_sampled_nodes``)."""
    edges, nodes = sum(hop_edges), sum(hop_nodes)
    return [(edges - sum(hop_edges[len(hop_edges) - i:]), nodes - sum(hop_nodes[len(hop_nodes) - i:]))
            for i in range(1, len(hop_edges))]


@dataclass(frozen=True)
class PygView:
    """A batch's ``edge_index`` with its `Graph` (`subgraph_graph`), the graphs of the
    prefixes PyG's ``trim_to_layer`` cuts from it by (edges, vertices) (`prefix_graph`),
    and the layouts the loader built ahead for them (`loader.layouts`; none when built in
    the step, where ``trimmed`` is empty and its graphs are built when first asked for)."""
    edge_index: torch.Tensor
    graph: Graph
    layouts: tuple[torch.Tensor, ...] = ()
    trimmed: dict[tuple[int, int], Graph] = field(default_factory=dict)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the view holds (to tie their memory to a consumer's CUDA stream)."""
        out = [self.edge_index]
        for graph in (self.graph, *self.trimmed.values()):
            out += [*graph.csr(), graph.in_degrees(), graph.out_degrees()]
        return out + list(self.layouts)


class PygViewDemand:
    """Whether a step has read a batch's ``edge_index`` (PyG's idiom, ``model(batch.x,
    batch.edge_index)``): from then on the loader builds each batch's `PygView` and its
    layouts ahead, in its own thread, as it does the blocks' (which such a step never
    reads). Before, a batch pays nothing for it. Worker processes learn it with the next
    epoch's jobs (`BatchMaker.learnt`); until then their batches' graphs are built in the
    step, still without a host read (`subgraph_graph`)."""

    def __init__(self) -> None:
        self.wanted = False
        self.trimmed = False        # a step has run a layer on a prefix (`trim_to_layer`)

    def mark(self) -> None:
        self.wanted = True

    def mark_trimmed(self) -> None:
        self.trimmed = True


def view_in_step(blocks: Sequence[Block], hop_edges: Sequence[int]) -> PygView:
    """The batch's `PygView`, built where its ``edge_index`` is first read (the step): the
    graph is on its first pass, as a layer's graph of a raw ``edge_index`` is
    (`Graph.coerce`: a small one runs without the kernels' layouts)."""
    edge_index = subgraph_edge_index(blocks, hop_edges)
    return PygView(edge_index, subgraph_graph(blocks, edge_index, hop_edges)._begin_first_pass())


def view_ahead(blocks: Sequence[Block], hop_edges: Sequence[int], max_in_degree: int | None,
               max_out_degree: int | None, source_side_read: Callable[[], None] | None,
               trimmed: bool = False) -> PygView:
    """The batch's `PygView` with the layouts the step's kernels read of its graph
    (`prepare_layouts`), built in the loader's thread; with ``trimmed`` also those of
    every prefix `trim_to_layer` cuts (`trimmed_sizes`). ``max_in_degree`` and
    ``max_out_degree`` bound the graphs' rows (None: unknown): a vertex's in-edges are
    one hop's sample of them, and its out-edges number at most the sum of each block's
    largest out-degree."""
    edge_index = subgraph_edge_index(blocks, hop_edges)
    graph = subgraph_graph(blocks, edge_index, hop_edges)
    layouts = prepare_layouts(graph, max_in_degree, None, max_out_degree, source_side_read=source_side_read)
    prefixes = {}
    if trimmed:
        for edges, nodes in trimmed_sizes(hop_edges, num_sampled_nodes(blocks)):
            prefix = prefixes[(edges, nodes)] = prefix_graph(graph, edges, nodes)
            layouts += prepare_layouts(prefix, max_in_degree, None, max_out_degree)
    return PygView(edge_index, graph, layouts, prefixes)


def remember_view(view: PygView, blocks: Sequence[Block], hop_edges: Sequence[int],
                  demand: PygViewDemand | None) -> None:
    """Hand ``view``'s graphs to `graph.index_cache` for its ``edge_index`` and for the
    prefixes of it PyG's ``trim_to_layer`` cuts (each under its vertex count, the key a
    layer given ``x`` asks with); a prefix's graph not built ahead is built when a layer
    first asks for it, on its first pass (as `view_in_step`'s), and tells ``demand``."""
    graph, trimmed = view.graph, view.trimmed
    remember(view.edge_index, graph.num_nodes, graph)
    sizes = trimmed_sizes(hop_edges, num_sampled_nodes(blocks))
    if not sizes:
        return

    def built(edges: int, nodes: int) -> Callable[[], Graph]:
        # holds the graphs, never ``edge_index`` itself: the cache keeps these while it lives
        def build() -> Graph:
            found = trimmed.get((edges, nodes))
            if found is not None:
                return found
            if demand is not None:
                demand.mark_trimmed()
            return prefix_graph(graph, edges, nodes)._begin_first_pass()
        return build
    remember_prefixes(view.edge_index, {(edges, nodes): built(edges, nodes) for edges, nodes in sizes})
