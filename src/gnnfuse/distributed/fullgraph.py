"""Full-graph training with the vertices partitioned across ranks, for graphs whose
activations do not fit on one GPU.

What is split and what is replicated: every rank holds the whole model (the weights are
small) and a full Adam state, but only its own vertices' features, labels and
activations, and the in-edges of those vertices (`partition.Partition`); the whole
graph's edge list (for the partition and GCN's global degrees) and label vector stay
where ``data`` has them, the feature table on the host (`training.prepare_data`). Each layer
first fetches the rows of the remote in-neighbours (`halo.HaloExchange`), then runs the
layer's own compiled program on the rank's bipartite block -- the same call a sampled
mini-batch makes (``conv((x_src, x_dst), block)``). GAT maps its rows first
(`GATConv.forward_projected`) where that moves fewer bytes, so the exchange carries
heads x channels per row rather than the input's width. Nothing about a layer is
re-implemented except GCN's normalisation, which must use *global* degrees: a halo
vertex's in-edges live on its owner, so its degree cannot be counted locally; GCN runs
as ``lin``, exchange, deg^-1/2 scaling by the whole graph's degrees, sum, scaling, bias.

The loss is the sum over ranks of each rank's summed cross-entropy divided by the
global number of training vertices, i.e. exactly the one-process mean. Each rank's
backward gives its share of every parameter's gradient (the halo exchange already sent
activation gradients to their owners); the shares are summed with one explicit
``all_reduce`` per step after the backward, so every rank applies the same update and
the weights stay identical without being broadcast again. Not DDP: DDP averages over
ranks where this loss already is the global mean, and its per-bucket all-reduces would
be issued during the backward, between the halo exchanges' own collectives, whose order
must then match on every rank; the gradients of these models are a few hundred KB, one
all-reduce at the end costs nothing to overlap.
Accuracies and the validation loss are global counts summed with one ``all_reduce``.

With dropout, each rank draws the masks of its own rows, so a run is not bit-for-bit
the one-process run (the masks differ), but each vertex row has one mask read by all its
readers, as on one process. Without dropout the result equals the one-process result to
floating-point tolerance (`tests/test_distributed_fullgraph.py`).
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ..graph import Graph
from ..nn.aggregation import eager_slots
from ..nn.block_models import BlockGNN
from ..nn.conv import GATConv, GCNConv, SAGEConv, _neighbour_sum
from ..nn.models import ModelSpec, TwoLayerGNN, build_model
from ..nn.functional import cross_entropy, dropout as sparse_dropout
from ..progress import progress_bar
from ..runtime.cuda_graph import CaptureFallbackWarning
from ..training.captured_step import row_mixing_module
from ..training.config import TrainConfig
from ..training.data import PreparedData
from ..training.interrupt import RunInterrupted
from ..training.loop import BestEpoch, EarlyStopping, RunResult, _optimizer, peak_memory_mib
from .agreement import check_agreement, describe_data, describe_settings
from .gradients import all_reduce_gradients, broadcast_parameters
from .halo import HaloExchange
from .inference import correct_predictions
from .partition import Partition, contiguous_owners, greedy_owners, partition_graph
from .stopping import carry_over, rank_interrupt, ranks_run_state, restore_ranks_run

SUPPORTED_LAYERS = (GCNConv, GATConv, SAGEConv)
PARTITIONED_MODELS = ("gcn", "gat", "sage")      # registry models built from SUPPORTED_LAYERS only
# The aggregations SAGEConv runs eagerly through PyG's module whose row for a vertex reads
# only that vertex's in-edges, so a rank's block gives the whole graph's rows. Not LSTM or
# GRU (each neighbour list is padded to the longest list of the graph the module gets, and
# the sequence runs over that padding) nor Equilibrium (it optimises every vertex together).
PER_VERTEX_AGGREGATIONS = frozenset({"MedianAggregation", "QuantileAggregation", "PowerMeanAggregation",
                                     "SoftmaxAggregation", "MLPAggregation", "DeepSetsAggregation",
                                     "AttentionalAggregation", "SetTransformerAggregation",
                                     "DegreeScalerAggregation", "VariancePreservingAggregation"})


def model_layers(model: nn.Module) -> tuple[list[nn.Module], Callable[[torch.Tensor], torch.Tensor], float]:
    """(convolutions, activation, dropout) of a model whose forward is ``dropout -> conv ->
    activation`` per layer (the registry's two-layer models and `BlockGNN`)."""
    if model._forward_hooks or model._forward_pre_hooks:
        # the partition runs the layers, never the model's own call, so its hooks would not run
        raise ValueError(f"partitioned full-graph training runs the layers of {type(model).__name__} itself, not "
                         "the model's call, so its forward hooks or forward pre-hooks would not run; remove them "
                         "or train the model on one process")
    # a subclass with a forward of its own computes something else than these layers
    if isinstance(model, TwoLayerGNN) and type(model).forward is TwoLayerGNN.forward:
        return [model.conv1, model.conv2], model.activation, model.dropout
    if isinstance(model, BlockGNN) and type(model).forward is BlockGNN.forward:
        return list(model.convs), model.activation, model.dropout
    raise ValueError(f"partitioned full-graph training runs models made of dropout -> conv -> activation layers "
                     f"(TwoLayerGNN, BlockGNN, with their own forward); got {type(model).__name__}")


def inv_sqrt_looped_degree(graph: Graph, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[N, 1] deg^-1/2 of every vertex in the graph with exactly one self loop each, the
    normalisation GCNConv computes on the whole graph (``_looped`` then in-degree)."""
    src, dst = graph.src.long(), graph.dst.long()
    degree = torch.bincount(dst[src != dst], minlength=graph.num_nodes) + 1
    return degree.to(torch.float64).pow(-0.5).to(dtype).unsqueeze(1)


def _check_gcn(conv: GCNConv) -> None:
    unsupported = [name for name, ok in (("normalize=False", conv.normalize),
                                         ("add_self_loops=False", conv.add_self_loops),
                                         ("improved=True", not conv.improved),
                                         ("flow='target_to_source'", conv.flow == "source_to_target"))
                   if not ok]
    if unsupported:
        raise ValueError(f"partitioned full-graph GCNConv supports PyG's default normalisation only, "
                         f"not {', '.join(unsupported)}")


def _check_sage(conv: SAGEConv) -> None:
    """Refuse an aggregation whose rows on a rank's block are not the whole graph's: on
    2 ranks an LSTM-aggregating SAGE's logits were up to 0.029 off in float64."""
    unsupported = sorted({name for name in eager_slots(conv.aggr_module) if name not in PER_VERTEX_AGGREGATIONS})
    if unsupported:
        raise ValueError(f"partitioned full-graph SAGEConv cannot run aggregation {', '.join(unsupported)}: its "
                         "row for a vertex depends on the rest of the graph it runs on (LSTM and GRU pad every "
                         "neighbour list to the graph's longest), so a rank's partition would give other rows "
                         "than the whole graph; use a per-vertex aggregation (mean, max, median, ...)")


class PartitionedModel:
    """A model's layers run on one rank's partition: ``net(x_owned)`` gives the output
    rows of the owned vertices, exchanging halo rows before every layer.

    ``graph`` is the whole graph (for GCN's global degrees); ``exchange`` the partition's
    halo plan. Call it from every rank, in the same order, as any collective."""

    def __init__(self, model: nn.Module, graph: Graph, exchange: HaloExchange):
        self.model = model
        self.convs, self.activation, self.dropout = model_layers(model)
        lazy = [name for name, p in model.named_parameters() if isinstance(p, nn.parameter.UninitializedParameter)]
        if lazy:
            # each rank would draw them at its first call from its own random stream
            raise ValueError(f"partitioned full-graph training needs every weight before the first step, so that "
                             f"all ranks hold the same ones; {', '.join(lazy)} are lazy (in_channels=-1): build the "
                             "layers with their input widths")
        mixing = row_mixing_module([model])
        if mixing is not None:
            # a norm over all rows sees only the rank's rows of a partition: a BatchNorm in the
            # activation moved 2-rank logits by 0.50 in float64, one in an MLPAggregation by 0.09
            raise ValueError(f"partitioned full-graph training computes each rank's rows on their own, but "
                             f"{mixing} computes a row from other vertices' rows (statistics over all rows): on "
                             "a partition it would see only the rank's rows; train the model on one process")
        for conv in self.convs:
            if not isinstance(conv, SUPPORTED_LAYERS):
                raise ValueError(f"partitioned full-graph training supports "
                                 f"{', '.join(c.__name__ for c in SUPPORTED_LAYERS)}; got {type(conv).__name__}")
            if isinstance(conv, GCNConv):
                _check_gcn(conv)
                if _calls_more_than(conv, GCNConv):      # the layer runs as partition code
                    raise ValueError(f"partitioned full-graph training computes GCNConv's layer itself (with "
                                     f"the whole graph's degrees), so {type(conv).__name__}'s own forward or "
                                     "forward hooks would not run; train it on one process")
            if isinstance(conv, SAGEConv):
                _check_sage(conv)
        self.exchange = exchange
        part = exchange.partition
        self.block = part.graph
        self._gcn = None
        if any(isinstance(conv, GCNConv) for conv in self.convs):
            scale = inv_sqrt_looped_degree(graph).to(part.owned.device)
            self._gcn = (self.block.remove_self_loops().add_self_loops(), scale[part.src_nodes], scale[part.owned])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            x = sparse_dropout(x, self.dropout, self.model.training)
            if isinstance(conv, GCNConv):
                x = self._gcn_layer(conv, x)
            elif isinstance(conv, GATConv) and _exchange_projected(conv, x):
                x = self._gat_layer(conv, x)
            else:
                x = self._bipartite_layer(conv, x)
            if i < last:
                x = self.activation(x)
        return x

    def _bipartite_layer(self, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The layer's own forward on the block: sources owned + halo, destinations owned."""
        x = x.to_dense() if x.is_sparse else x
        return conv((self.exchange.sources(x), x), self.block)

    def _gat_layer(self, conv: GATConv, x: torch.Tensor) -> torch.Tensor:
        """GAT with ``lin`` applied to the owned rows before the exchange: the mapped rows
        (heads x channels) cross ranks, not the input (on products-like x5 with F=512, 20 GB
        of halo rows per rank and step), and no rank maps its halo rows again."""
        x = x.to_dense() if x.is_sparse else x
        h = conv.lin(x)
        return conv.forward_projected(self.exchange.sources(h), h, self.block)

    def _gcn_layer(self, conv: GCNConv, x: torch.Tensor) -> torch.Tensor:
        """``D^-1/2 (A + I) D^-1/2 X W + b`` with the whole graph's D: the narrower ``X W``
        is what crosses ranks."""
        looped, src_scale, dst_scale = self._gcn
        h = self.exchange.sources(conv.lin(x))
        out = _neighbour_sum(looped, {"h": h * src_scale.to(h.dtype)}) * dst_scale.to(h.dtype)
        return out if conv.bias is None else out + conv.bias


def _exchange_projected(conv: GATConv, x: torch.Tensor) -> bool:
    """Whether a GAT layer moves fewer bytes by exchanging ``lin``'s rows than its input's:
    per halo row, the input crosses once forward, and back as a gradient only where it
    needs one; the mapped rows cross forward and back (``lin``'s weight wants their
    gradient). The benchmark's first layer (F=512 -> 8 x 8, an input without gradient):
    512 against 128 values."""
    if not conv.projects_first() or _calls_more_than(conv, GATConv):     # its forward must run
        return False
    width = conv.heads * conv.out_channels
    projected = width * (2 if x.requires_grad or conv.lin.weight.requires_grad else 1)
    return projected < x.shape[1] * (2 if x.requires_grad else 1)


def _calls_more_than(conv: nn.Module, base: type) -> bool:
    """Whether calling ``conv`` runs more than ``base.forward``: a subclass's own forward,
    or forward hooks -- which the partition's own computation of the layer would skip."""
    return type(conv).forward is not base.forward or bool(conv._forward_hooks or conv._forward_pre_hooks)


def rank_device(device: str) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` (torchrun's variable; else the current
    device) for ``cuda``, else ``device``. NCCL is needed for CUDA tensors."""
    if device != "cuda":
        return torch.device(device)
    index = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
    torch.cuda.set_device(index)
    if dist.get_backend() != "nccl":
        raise ValueError(f"full-graph training on CUDA needs the NCCL backend, the process group uses "
                         f"{dist.get_backend()!r}")
    return torch.device("cuda", index)


@dataclass(frozen=True)
class Shard:
    """One rank's rows of a data set, on its device, and the global split sizes."""
    partition: Partition
    x: torch.Tensor
    y: torch.Tensor
    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    split_sizes: tuple[int, int, int]


PARTITIONERS = {"greedy": greedy_owners, "contiguous": contiguous_owners}


def agreed_owners(graph: Graph, device: torch.device, method: str = "greedy", group: Any = None) -> torch.Tensor:
    """The owner of every vertex by `PARTITIONERS[method]`, computed on rank 0 and
    broadcast (through ``device``, the process group's), so no two ranks can disagree
    about a vertex (a partition computed on every rank would have to be bit-identical
    across devices and library versions); on the graph's device."""
    if method not in PARTITIONERS:
        raise ValueError(f"unknown partition method {method!r}; known: {', '.join(PARTITIONERS)}")
    world_size = dist.get_world_size(group)
    owner = (PARTITIONERS[method](graph, world_size).to(device) if dist.get_rank(group) == 0
             else torch.empty(graph.num_nodes, dtype=torch.int64, device=device))
    dist.broadcast(owner, src=0, group=group)
    return owner.to(graph.device)


def shard_data(data: PreparedData, rank: int, world_size: int, device: torch.device, owner: torch.Tensor) -> Shard:
    """Rank ``rank``'s partition under ``owner`` and its rows of ``data``, on ``device``."""
    partition = partition_graph(data.graph, owner, rank, world_size).to(device)
    owned = partition.owned
    masks = tuple(m[owned.to(m.device)].to(device) for m in data.masks)
    x = data.x.index_select(0, owned.to(data.x.device)).to(device)
    x = x.coalesce() if x.is_sparse else x          # index_select leaves sparse rows uncoalesced
    return Shard(partition, x, data.y[owned.to(data.y.device)].to(device), masks,
                 tuple(int(m.sum()) for m in data.masks))


class _EpochStats:
    """Global training loss, accuracies and validation loss from one float64 all_reduce;
    NaN for an empty split, as the one-process means give (an empty training set then
    stops the run as diverged on every rank, not a loss of 0 that trains on weight decay)."""

    def __init__(self, shard: Shard):
        self.shard = shard

    def reduce(self, train_loss_sum: torch.Tensor, logits: torch.Tensor, stop: bool = False
               ) -> tuple[tuple[float, ...], bool]:
        """((loss, val loss, train, val, test accuracy), whether any rank asked to
        ``stop``: the `stopping` module's flag, carried in the same all-reduce)."""
        y, masks = self.shard.y, self.shard.masks
        val = masks[1]
        parts = [train_loss_sum.detach().double().reshape(1),
                 F.cross_entropy(logits[val], y[val], reduction="sum").double().reshape(1)]
        for mask in masks:
            parts.append(correct_predictions(logits[mask], y[mask]).reshape(1))
        parts.append(torch.full((1,), float(stop), dtype=torch.float64, device=logits.device))
        summed = torch.cat(parts)
        dist.all_reduce(summed)
        totals = summed.tolist()
        n_train, n_val, _ = self.shard.split_sizes
        counts = (n_train, n_val, *self.shard.split_sizes)
        return tuple(total / n if n else float("nan") for total, n in zip(totals, counts)), totals[-1] > 0


def train_full_graph_run(config: TrainConfig, spec: ModelSpec, data: PreparedData, seed: int, *,
                         label: str = "", log_epochs: bool = True, cuda_graph: str = "auto",
                         resume_from: dict[str, Any] | None = None) -> RunResult:
    """`gnnfuse.training.train_run` on the ranks of the initialised default process group,
    each training on its partition of the graph (`shard_data`); every rank returns the
    same `RunResult` (rank 0 alone logs and draws the progress bar). The training step
    is never captured in a CUDA graph (its halo exchanges and all-reduce are collectives
    with host-side split sizes): ``cuda_graph="on"`` warns so, as `StepCapture` warns
    when it cannot capture. ``data`` may stay on the host: only the rank's shard moves to
    its device.

    Ctrl-C on any rank ends the run on every rank at the end of the epoch (`stopping`)
    with `RunInterrupted`, whose state passed back as ``resume_from`` continues it exactly."""
    if config.model not in PARTITIONED_MODELS:
        raise ValueError(f"model {config.model!r} has no partitioned full-graph version; partitioned models: "
                         f"{', '.join(PARTITIONED_MODELS)}")
    if not dist.is_initialized():
        raise RuntimeError("partitioned full-graph training needs torch.distributed initialised "
                           "(launch with torchrun or gnnfuse train --gpus N)")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = rank_device(config.device)
    # each rank reads its own copy of the data set, and may be started with settings of its own
    check_agreement(describe_settings(config, seed) + describe_data(data), "the training settings and data sets")
    if cuda_graph == "on" and rank == 0:
        warnings.warn("gnnfuse: --cuda-graph on: the partitioned full-graph step is not captured (it exchanges "
                      "halo rows and all-reduces gradients between ranks every step); it runs eagerly",
                      CaptureFallbackWarning, stacklevel=2)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build_model(config.model, data.num_features, data.num_classes, config.hidden,
                        config.dropout).to(device)
    broadcast_parameters(model)
    torch.manual_seed(seed + 1_000_003 * rank)       # each rank its own dropout stream
    optimizer = _optimizer(spec, model, config)
    shard = shard_data(data, rank, world_size, device, agreed_owners(data.graph, device))
    exchange = HaloExchange(shard.partition)
    net = PartitionedModel(model, data.graph, exchange)
    train_index = shard.masks[0].nonzero().squeeze(1)
    train_y = shard.y[train_index]
    # Not clamped to 1: with no training vertex the one-process mean is NaN (an empty
    # mean), which stops the run as diverged; 0 / 0 here gives that NaN on every rank.
    global_train = shard.split_sizes[0]
    stats = _EpochStats(shard)

    history: dict[str, list[float]] = {key: [] for key in ("loss", "val_loss", "train_acc", "val_acc", "test_acc")}
    stopping = EarlyStopping(config.patience)
    best = BestEpoch(history, stopping)
    done = 0 if resume_from is None else restore_ranks_run(resume_from, model, optimizer, best)[0]
    start = time.perf_counter() - (0.0 if resume_from is None else resume_from["seconds"])
    epochs = range(done + 1, config.epochs + 1)
    progress = progress_bar(epochs, desc=f"train{label}", unit="epoch") if rank == 0 else tqdm(epochs, disable=True)
    stop = False
    with rank_interrupt() as interrupt:
        for epoch in progress:
            epoch_start = time.perf_counter()
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss_sum = cross_entropy(net(shard.x), train_y, reduction="sum", rows=train_index)
            (loss_sum / global_train).backward()
            all_reduce_gradients(model.parameters())
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            epoch_ms = (time.perf_counter() - epoch_start) * 1e3
            model.eval()
            with torch.no_grad():
                (loss, val_loss, train_acc, val_acc, test_acc), stop = stats.reduce(loss_sum, net(shard.x),
                                                                                    interrupt.requested)
            best.record(epoch, (loss, val_loss, train_acc, val_acc, test_acc), model, val_acc, val_loss, test_acc)
            progress.set_postfix(loss=f"{loss:.4f}", val=f"{val_acc:.4f}", test=f"{test_acc:.4f}")
            if log_epochs and rank == 0:
                tqdm.write(f"{label.strip() + ' | ' if label else ''}epoch {epoch:4d} | loss {loss:.4f} | "
                           f"train {train_acc:.4f} | val {val_acc:.4f} | test {test_acc:.4f} | {epoch_ms:7.1f} ms | "
                           f"peak {peak_memory_mib(device):.0f} MiB (rank 0) | halo sent by rank 0: "
                           f"{exchange.forward_bytes / 2**20:.1f} MiB rows (training and evaluation forward), "
                           f"{exchange.backward_bytes / 2**20:.1f} MiB gradients", file=sys.stdout)
            exchange.reset_counts()
            if stopping.should_stop:
                break
            if stop and epoch < config.epochs:
                progress.close()
                raise RunInterrupted(ranks_run_state(epoch, model, optimizer, best, time.perf_counter() - start))
        carry_over(interrupt, stop)
    progress.close()
    return RunResult(seed=seed, best_epoch=stopping.best_epoch, best_val_acc=stopping.reported_val_acc,
                     test_acc=best.test_acc, epochs_run=len(history["loss"]), seconds=time.perf_counter() - start,
                     state_dict=best.state_dict, history=history,
                     cuda_graph=f"eager: partitioned full-graph training on {world_size} ranks (collectives per step)",
                     interrupted=stop)
