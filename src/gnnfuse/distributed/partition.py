"""Vertex partitions for full-graph training on several ranks: who owns which vertex, and
what each rank needs from the others.

Each rank owns a set of vertices and computes every layer's output rows for them only.
A layer's output at vertex ``v`` reads its in-neighbours, so a rank also needs the rows
of the in-neighbours it does not own -- its *halo* -- fetched from their owners before
each layer (`halo.HaloExchange`). A rank's layer runs on a bipartite graph in the
convention of sampled blocks (`gnnfuse.loader.Block`): destinations are the owned
vertices, sources are the owned vertices (the first ``num_owned``, so ``x_dst =
x_src[:num_owned]`` and a local self loop ``i -> i`` is a true self loop) followed by
the halo, and the edges are every in-edge of an owned vertex, in local ids.

Which vertices a rank owns decides the halo, i.e. how many rows cross ranks per layer.
`greedy_owners` (linear deterministic greedy streaming, Stanton & Kliot 2012, vectorised
in chunks) is the default, because the real data sets are not numbered with locality:
contiguous ranges of their ids cut as many edges as a random assignment, while the greedy
pass cuts a third to a half as many and fetches 40-60% fewer halo rows, at the same load
balance (`partition_stats`, 2 ranks: cora 49% of edges cut contiguous vs 18% greedy,
2214 vs 1081 halo rows; citeseer 52% vs 18%; pubmed 50% vs 26%, 13990 vs 8779 rows; at 8
ranks pubmed 88% vs 48%). On the Chung-Lu benchmark presets, random graphs with no
communities to find, it still saves a quarter of the cut (arxiv-like, 2 ranks: 50% vs
38%). It costs at most 4096 vectorised steps (about a second on these graphs) and is
computed once, on rank 0. `contiguous_owners` (ranges balanced by ``in-degree + 1``,
one cumulative sum) is there for graphs numbered with locality (crawl or BFS order) and
as the simplest baseline; a full multilevel METIS cut would need a native library for a
gain the greedy pass mostly already takes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph import Graph


@dataclass(frozen=True)
class Partition:
    """One rank's share of a graph and its halo-exchange plan.

    ``owned``: global ids of the vertices this rank owns, ascending. ``halo``: global ids
    of the remote in-neighbours of owned vertices, grouped by owner rank and ascending
    within a group, so the rows arriving from one all-to-all land in this order.
    ``graph``: the bipartite local graph (sources ``owned`` then ``halo``, destinations
    ``owned``, local ids). ``send_index``: the local (owned) ids of the rows every other
    rank needs, grouped by that rank, each group in the order the receiver's halo has
    them; ``send_counts[r]`` / ``recv_counts[r]``: rows sent to / received from rank r.
    """
    rank: int
    world_size: int
    num_nodes: int
    owned: torch.Tensor
    halo: torch.Tensor
    graph: Graph
    send_index: torch.Tensor
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]

    @property
    def num_owned(self) -> int:
        return self.owned.numel()

    @property
    def num_halo(self) -> int:
        return self.halo.numel()

    @property
    def src_nodes(self) -> torch.Tensor:
        """Global ids of the local graph's sources (owned, then halo), as `Block.src_nodes`."""
        return torch.cat([self.owned, self.halo])

    def to(self, device: torch.device | str) -> Partition:
        return Partition(self.rank, self.world_size, self.num_nodes, self.owned.to(device), self.halo.to(device),
                         self.graph.to(device), self.send_index.to(device), self.send_counts, self.recv_counts)


def _check_world(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")


def contiguous_owners(graph: Graph, world_size: int) -> torch.Tensor:
    """int64 [N]: the owner rank of every vertex, as contiguous id ranges balanced by
    ``in-degree + 1`` per vertex (a layer's work: one message per in-edge, one output
    row per vertex). Rank r's range is where the cumulative cost before a vertex lies in
    ``[r, r + 1) * total / world_size``."""
    _check_world(world_size)
    cost = graph.in_degrees().to(torch.int64) + 1
    before = torch.cumsum(cost, 0) - cost
    return torch.clamp((before * world_size) // max(int(cost.sum()), 1), max=world_size - 1)


def greedy_owners(graph: Graph, world_size: int, slack: float = 1.05, chunk: int | None = None) -> torch.Tensor:
    """int64 [N]: the owner rank of every vertex by linear deterministic greedy streaming
    (LDG, Stanton & Kliot 2012): vertices in id order each go to the rank holding most of
    their already placed neighbours (either edge direction), discounted by ``1 - load /
    capacity`` so ranks fill evenly, ties to the lighter rank. Load is ``in-degree + 1`` as
    in `contiguous_owners`; the capacity is ``slack`` times an even share.

    Vectorised over ``chunk`` consecutive vertices at a time (default: N / 4096, at
    least 1), a vertex not seeing the placements made in its own chunk: at most 4096
    steps, so a 2.4M-vertex graph takes seconds rather than the minutes of one Python
    step per vertex, with the cut of the one-at-a-time pass (pubmed, 2 ranks, chunks of 5
    vertices: 25.5% of edges cut, one at a time 25.6%)."""
    _check_world(world_size)
    n, device = graph.num_nodes, graph.device
    chunk = chunk or max(1, -(-n // 4096))
    src, dst = graph.src.long(), graph.dst.long()
    ends, others = torch.cat([src, dst]), torch.cat([dst, src])
    order = torch.argsort(ends, stable=True)
    neighbours = others[order]
    starts = torch.zeros(n + 1, dtype=torch.int64, device=device)
    starts[1:] = torch.cumsum(torch.bincount(ends, minlength=n), 0)
    cost = (torch.bincount(dst, minlength=n) + 1).to(torch.float64)
    capacity = slack * float(cost.sum()) / world_size
    owner = torch.full((n,), -1, dtype=torch.int64, device=device)
    load = torch.zeros(world_size, dtype=torch.float64, device=device)
    firsts = list(range(0, n, chunk))
    bounds = starts[firsts + [n]].tolist()     # on the host: no device sync per step
    for step, first in enumerate(firsts):
        last = min(first + chunk, n)
        lo, hi = bounds[step], bounds[step + 1]
        rows = torch.repeat_interleave(torch.arange(last - first, device=device),
                                       starts[first + 1:last + 1] - starts[first:last], output_size=hi - lo)
        placed = owner[neighbours[lo:hi]]
        counts = torch.zeros(last - first, world_size, dtype=torch.float64, device=device)
        # unplaced neighbours (-1) count 0 towards rank 0
        counts.index_put_((rows, placed.clamp(min=0)), (placed >= 0).to(torch.float64), accumulate=True)
        room = torch.clamp(1.0 - load / capacity, min=0.0)
        chosen = torch.argmax(counts * room - 1e-9 * load / capacity, dim=1)     # ties: the lighter rank
        owner[first:last] = chosen
        load.index_add_(0, chosen, cost[first:last])
    return owner


@dataclass(frozen=True)
class PartitionStats:
    """How good a partition is for halo exchange.

    ``edge_cut``: fraction of edges whose ends have different owners; ``halo_rows``: rows
    all ranks fetch per layer (the communication volume, in rows); ``imbalance``: the
    heaviest rank's ``in-degree + 1`` load over the mean."""
    edge_cut: float
    halo_rows: int
    imbalance: float


def partition_stats(graph: Graph, owner: torch.Tensor, world_size: int) -> PartitionStats:
    """`PartitionStats` of ``graph`` under ``owner`` (a rank per vertex, any integer dtype:
    read as int64, as `partition_graph` does -- an int32 owner, what METIS hands back,
    made the halo keys ``owner * N + src`` int32, and ranks x vertices past 2^32 collided)."""
    owner = owner.to(graph.device, torch.int64)
    src, dst = graph.src.long(), graph.dst.long()
    cut = owner[src] != owner[dst]
    n = graph.num_nodes
    halo_rows = torch.unique(owner[dst[cut]] * n + src[cut]).numel()
    load = torch.zeros(world_size, dtype=torch.float64, device=owner.device).index_add_(
        0, owner, (graph.in_degrees() + 1).to(torch.float64))
    return PartitionStats(edge_cut=cut.double().mean().item() if cut.numel() else 0.0, halo_rows=halo_rows,
                          imbalance=(load.max() / load.mean()).item())


def partition_graph(graph: Graph, owner: torch.Tensor, rank: int, world_size: int) -> Partition:
    """Rank ``rank``'s `Partition` of ``graph`` under ``owner`` (int64 [N], ranks below
    ``world_size``; a rank may own nothing).

    Every rank computes its own from the whole graph: the receive side (this rank's halo)
    and the send side (the rows other ranks' halos hold of this rank's vertices) come out
    in the same order -- grouped by rank, ascending global id -- without a handshake."""
    if graph.is_bipartite:
        raise ValueError("partition_graph needs a graph with one vertex set, got a bipartite one")
    n = graph.num_nodes
    owner = owner.to(graph.device, torch.int64)
    if owner.shape != (n,):
        raise ValueError(f"owner must have one rank per vertex ({n}), got shape {list(owner.shape)}")
    if not 0 <= rank < world_size or (n and not 0 <= int(owner.min()) <= int(owner.max()) < world_size):
        raise ValueError(f"rank {rank} and every owner must lie in [0, {world_size})")
    src, dst = graph.src.long(), graph.dst.long()
    owned = torch.nonzero(owner == rank).squeeze(1)

    into = owner[dst] == rank
    in_src, in_dst = src[into], dst[into]
    remote = in_src[owner[in_src] != rank]
    halo_keys = torch.unique(owner[remote] * n + remote)           # sorted: by owner, then global id
    halo = halo_keys % n if n else halo_keys
    recv = torch.bincount(halo_keys // n, minlength=world_size) if n else torch.zeros(world_size, dtype=torch.int64)

    local = torch.full((n,), -1, dtype=torch.int64, device=graph.device)
    local[owned] = torch.arange(owned.numel(), device=graph.device)
    local[halo] = owned.numel() + torch.arange(halo.numel(), device=graph.device)
    local_src, local_dst = local[in_src], local[in_dst]
    by_dst = torch.argsort(local_dst, stable=True)
    block = Graph(local_src[by_dst], local_dst[by_dst], owned.numel(), num_src_nodes=owned.numel() + halo.numel())

    out = (owner[src] == rank) & ~into
    send_keys = torch.unique(owner[dst[out]] * n + src[out])         # sorted: by receiver, then global id
    send_index = local[send_keys % n] if n else send_keys
    sent = torch.bincount(send_keys // n, minlength=world_size) if n else torch.zeros(world_size, dtype=torch.int64)
    return Partition(rank, world_size, n, owned, halo, block, send_index,
                     tuple(int(c) for c in sent.tolist()), tuple(int(c) for c in recv.tolist()))
