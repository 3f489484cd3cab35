"""Mini-batch training steps replayed from a CUDA graph (opt-in).

A sampled batch's step is host-bound: on products-sized GraphSAGE its Python and kernel
launches took 6.6 ms per step on an H100 for 2.7 ms of device work. `runtime.StepCapture`
replays a whole step in one launch, but only on the tensors it was captured with. A
loader with ``static_shapes`` pads every batch to fixed shapes (`loader.static_shapes`),
so `BlockStepCapture` keeps one *static batch* -- a copy of the first padded batch, its
block graphs with their caches -- captures the step on it, and for every later batch
copies the batch's tensors into the static one's and replays.

What keeps a replay from computing something else than the eager step would:

- **Same structure.** A batch is copied in only when every tensor it holds has the
  static batch's shape, dtype and stride, and every other value (vertex counts, cache
  keys, ``batch_size``) is equal; otherwise that batch runs eagerly. So batches that did
  not fit the capacities (unpadded) run eagerly, with the same numbers, and so does the
  epoch's last, smaller batch (another ``batch_size``) -- unless the step declares
  ``short_batches="replay"``: its loss reads the seeds only as rows ``[:batch_size]`` of
  the output and of ``batch.y`` and ignores ``IGNORE_LABEL`` (`classification_step`'s
  does). A short batch's labels past its seeds are ``IGNORE_LABEL`` (the padding), so
  the static batch's ``batch_size`` rows give the short batch's loss and gradients, and
  it replays. A short batch with a float ``y`` runs eagerly still: its padded labels
  are ``-100.0``, which a regression loss reads. On four data-parallel ranks each
  epoch's last batch (one seed of 196,615 split four ways) ran eagerly for 14-37 ms, 5-10% of a 0.3 s epoch.
- **Sealed graph caches.** Anything a layer derives from a block and caches on its graph
  during the eager warm-up would be replayed from the first batch. The static graphs'
  cache keys are recorded when the static batch is made (the loader prebuilds what the
  layers read, `loader.layouts`); a key added by a step means the capture is dropped and
  every step runs eagerly, with a warning naming the key. What a layer must derive per
  batch instead builds in fixed shapes inside the step, uncached, so each replay
  rebuilds it (attention layers' self loops on padded blocks, `nn.padded_loops`).
- **Row-local models.** Padded rows only feed padded rows as long as every op computes a
  row from its own row and in-edges; batch normalisation (and PyG's graph-wide norms,
  its ``LayerNorm`` in ``mode="graph"`` included) would mix the padded rows into the
  real ones, so models holding one are not captured, and a padded batch of blocks is
  refused for them with an error (`GraphStepCapture` runs its batches unpadded). Such
  a module left out of ``modules=``, or ``F.batch_norm`` in the step, is found when the
  first padded batch's step calls it (`RowMixingWatch`).

Everything else -- warm-up, the audit for host syncs, optimizer checks, fallback on a
failed capture, fresh dropout masks per replay -- is `StepCapture`'s.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..graph import Graph
from ..loader import MiniBatch
from ..loader.padded_graph_batch import padded_capacities, unpadded
from ..loader.static_shapes import DERIVED_KEYS, IGNORE_LABEL, complete, copy_into
from ..runtime.cuda_graph import (DEFAULT_WARMUP, CaptureFallbackWarning, StepCapture, check_mode, check_warmup,
                                  step_device)
from .label_use import LabelWatch
from .static_graph_batch import StaticGraphBatch

SHORT_BATCHES = ("eager", "replay")     # what BlockStepCapture does with a batch of fewer seeds
LABEL_KEYS = ("y",)       # a padded graph batch's labels: IGNORE_LABEL in its padding (GraphStepCapture)
MASK_KEYS = ("y_mask",)   # and their mask, 0 on the padding (DataLoader(label_mask=True))

# Normalisations over all rows of a batch: the padded rows would change their statistics.
ROW_MIXING = ("BatchNorm", "InstanceNorm", "GraphNorm", "PairNorm", "MeanSubtractionNorm", "DiffGroupNorm",
              "GraphSizeNorm")
# PyG's LayerNorm mixes rows in its default mode "graph": it normalises over a graph's
# rows, over all rows where no batch vector is passed (as in GIN's MLPs from
# norm="layer_norm"); mode "node" (HeteroLayerNorm's only one), like torch's LayerNorm,
# does not.
GRAPH_MODE_NORMS = ("LayerNorm",)
# PyG's aggregations whose result for a group (a graph of a readout, a vertex's in-edges)
# depends on the batch's other groups, and why: the padding graph, usually the largest,
# lengthened every real graph's sequence (a GIN + LSTMAggregation readout's losses moved
# by up to 0.023; LCM's by 0.016), and the padding graphs changed Equilibrium's (0.11)
_SEQUENCE = "which reads each group padded to the batch's largest"
BATCH_DEPENDENT_AGGREGATIONS = {
    "LSTMAggregation": _SEQUENCE, "GRUAggregation": _SEQUENCE,
    "LCMAggregation": "which reduces each group in a tree as wide as the batch's largest",
    "EquilibriumAggregation": "whose regulariser is a mean over all groups, which scales each group's steps",
    # tied keys (ReLU's zeros) are ordered by torch's unstable sort of rows as wide as the
    # largest group: a DGCNN-style readout's loss moved by 0.52
    "SortAggregation": "whose sort orders tied rows differently in rows as wide as the batch's largest group",
    "PatchTransformerAggregation": "which attends over patches as many as the batch's largest group fills"}


def row_mixing_module(modules: Sequence[torch.nn.Module]) -> str | None:
    """The name of the first submodule whose output rows depend on other rows' values:
    a norm over all rows, an aggregation whose groups depend on the batch's other groups
    (`BATCH_DEPENDENT_AGGREGATIONS`), or a layer saying so by its ``row_mixing`` reason (`nn.ChebConv` without
    normalization)."""
    for top in modules:
        for name, module in top.named_modules():
            kind = type(module).__name__
            reason = getattr(module, "row_mixing", None)
            if isinstance(reason, str):
                return f"{name or kind} ({kind}, {reason})"
            if kind in BATCH_DEPENDENT_AGGREGATIONS:
                return f"{name or kind} ({kind}, {BATCH_DEPENDENT_AGGREGATIONS[kind]})"
            if (isinstance(module, torch.nn.modules.batchnorm._NormBase) or any(k in kind for k in ROW_MIXING)
                    or (any(k in kind for k in GRAPH_MODE_NORMS) and getattr(module, "mode", None) == "graph")):
                return f"{name or type(top).__name__} ({kind})"
    return None


class RowMixingWatch(TorchFunctionMode):
    """``with RowMixingWatch() as watch: step(batch)``; then ``watch.found`` names the
    first thing the step called that mixes rows: a module `row_mixing_module` names
    (every module called through ``__call__``, whether ``modules=`` holds it or not), or
    ``F.batch_norm`` with batch statistics written in the step itself. Why: the check of
    ``modules=`` alone missed a model left out of it and a functional batch norm, and
    their steps replayed over the padded rows without a word. With ``refuse`` (what to
    do instead) the first such call raises a ValueError saying so, before it runs: a
    padded batch of blocks has no unpadded form to fall back to."""

    def __init__(self, refuse: str | None = None) -> None:
        super().__init__()
        self._called: dict[int, torch.nn.Module] = {}
        self._hook: Any = None
        self._functional: str | None = None
        self._refuse = refuse

    def __enter__(self) -> "RowMixingWatch":
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._note)
        return super().__enter__()

    def _note(self, module: torch.nn.Module, args: Any) -> None:
        if id(module) in self._called:
            return
        self._called[id(module)] = module
        if self._refuse is not None:
            self._refused(row_mixing_module([module]))

    def _refused(self, found: str | None) -> None:
        if found is not None and self._refuse is not None:
            raise ValueError(f"{found} normalises over all rows, {self._refuse}")

    def __exit__(self, *exc: Any) -> None:
        self._hook.remove()
        super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.batch_norm and self._functional is None:
            bound = inspect.signature(F.batch_norm).bind(*args, **kwargs)
            bound.apply_defaults()
            if bound.arguments["training"] or bound.arguments["running_mean"] is None:
                self._functional = "torch.nn.functional.batch_norm (with batch statistics)"
                self._refused(self._functional)
        return func(*args, **kwargs)

    @property
    def found(self) -> str | None:
        return row_mixing_module(list(self._called.values())) or self._functional


# What a row-mixing model on a padded batch of blocks is told (it has no unpadded form)
PADDED_BLOCKS_REMEDY = ("which on a padded batch would count the padded rows: train it on unpadded batches "
                        "(NeighborLoader(static_shapes=False))")


# A graph's seal (`Graph.check_unchanged`): the version counters of its index tensors,
# which differ from batch to batch and are no part of its structure.
_SEAL = ("_sealed", "_sealed_layouts", "_wrapper_version")


def _flatten(value: Any, path: tuple, tensors: list[torch.Tensor], layout: list) -> None:
    """Every tensor reachable from a batch, in a fixed order, and the batch's structure
    with each tensor's (shape, dtype, stride, device) and every other value in its place."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        layout.append((path, tuple(value.shape), value.dtype, value.stride(), value.device))
    elif isinstance(value, Graph):
        for key, item in sorted(vars(value).items()):
            if key not in _SEAL:
                _flatten(item, path + (key,), tensors, layout)
    elif isinstance(value, dict):
        layout.append((path, "dict", tuple(sorted(value))))
        for key in sorted(value):
            _flatten(value[key], path + (key,), tensors, layout)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        layout.append((path, type(value).__name__))
        for field in dataclasses.fields(value):
            _flatten(getattr(value, field.name), path + (field.name,), tensors, layout)
    elif isinstance(value, (tuple, list)):
        layout.append((path, type(value).__name__, len(value)))
        for k, item in enumerate(value):
            _flatten(item, path + (k,), tensors, layout)
    else:
        layout.append((path, value))


def _structure(batch: MiniBatch) -> tuple[list[torch.Tensor], list]:
    tensors: list[torch.Tensor] = []
    layout: list = []
    _flatten(batch, (), tensors, layout)
    layout.append(("batch_size", batch.batch_size))
    return tensors, layout


def _graphs(value: Any) -> list[Graph]:
    """Every `Graph` reachable from a batch (its blocks' graphs and the graphs in their
    caches, a self-looped copy's), as `_flatten` walks it."""
    if isinstance(value, Graph):
        return [value, *(g for key, item in vars(value).items() if key not in _SEAL for g in _graphs(item))]
    if isinstance(value, dict):
        return [g for item in value.values() for g in _graphs(item)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [g for field in dataclasses.fields(value) for g in _graphs(getattr(value, field.name))]
    if isinstance(value, (tuple, list)):
        return [g for item in value for g in _graphs(item)]
    return []


class StaticBatch:
    """A padded batch's copy whose tensors stay where they are (`load` overwrites them).
    A deferred batch's copy gets a feature buffer ``batch.x`` (rows of ``features``),
    which `complete` fills in place, as it rebuilds the layouts in place."""

    def __init__(self, batch: MiniBatch, features: torch.Tensor | None = None) -> None:
        if not batch.padded:
            raise ValueError("a static batch is made from a padded batch (NeighborLoader(static_shapes=True))")
        copied = copy.deepcopy(batch)          # one copy per tensor; aliases stay aliases
        self._tensors, self._layout = _structure(copied)
        self._graphs = _graphs(copied)
        if batch.deferred:
            if features is None:
                raise ValueError("a deferred batch (NeighborLoader(deferred=True)) needs the feature table its rows "
                                 "come from: BlockStepCapture(..., features=loader.features)")
            copied = dataclasses.replace(copied, x=features.new_empty((batch.n_id.numel(),) + features.shape[1:]))
        self.batch, self.features = copied, features
        self._cache_keys = self._keys()

    def complete(self) -> MiniBatch:
        """The static batch with its feature rows and layouts (re)built in place (a
        non-deferred one as it is): what the captured step runs on."""
        return complete(self.batch, self.features, self.batch.x) if self.batch.deferred else self.batch

    def _keys(self) -> list[tuple[str, ...]]:
        return [tuple(block.graph._cache) for block in self.batch.blocks]

    def load(self, batch: MiniBatch, short: bool = False) -> str | None:
        """Copy ``batch`` into the static batch; or say why it cannot (then nothing is
        copied). ``short``: a batch with fewer seeds that is otherwise the same is copied
        too, its seeds into the first rows of ``input_id`` (the static batch keeps its
        ``batch_size``; see the module doc for when that is the short batch's step)."""
        if not batch.padded:
            return "the batch did not fit the loader's capacities (it is not padded)"
        sources, layout = _structure(batch)
        if layout != self._layout:
            differs = next((a[0] for a, b in zip(layout, self._layout) if a != b), "length")
            if not (short and self._only_fewer_seeds(layout)):
                return f"it differs from the captured batch at {differs}"
            labels = getattr(batch, "y", None)
            if isinstance(labels, torch.Tensor) and labels.is_floating_point():
                # its padded seeds' labels are IGNORE_LABEL as a float, which a regression
                # loss (mse_loss over rows [:batch_size] of the static batch) reads as targets
                return (f"it has fewer seeds and a float y, whose padded seeds' labels ({float(IGNORE_LABEL)}) "
                        "a replayed loss would read (short_batches='replay' is for losses that ignore them)")
            # the static seeds past the short batch's stay: the step reads none of them
            sources = [torch.cat([s, t[s.numel():]]) if s is batch.input_id else s
                       for s, t in zip(sources, self._tensors)]
        copy_into(self._tensors, sources)
        for graph in self._graphs:      # edges and every cached layout rewritten together: they agree
            graph._reseal()
        return None

    def _only_fewer_seeds(self, layout: list) -> bool:
        """Whether ``layout`` is the static batch's but for fewer seeds: a shorter
        ``input_id`` and a smaller ``batch_size``, every other entry equal."""
        if len(layout) != len(self._layout):
            return False
        for mine, theirs in zip(self._layout, layout):
            if mine == theirs:
                continue
            if mine[0] == ("input_id",) and theirs[0] == mine[0] and theirs[2:] == mine[2:] and \
                    theirs[1][0] < mine[1][0]:
                continue
            if mine[0] == "batch_size" and theirs[0] == mine[0] and theirs[1] < mine[1]:
                continue
            return False
        return True

    def added_cache_keys(self) -> list[str]:
        """Keys a step cached on the static graphs since they were made (see module doc),
        besides the layouts `complete` rebuilds in place."""
        return [f"blocks[{i}].graph: {key!r}" for i, (block, then) in enumerate(zip(self.batch.blocks, self._cache_keys))
                for key in block.graph._cache if key not in then and key != DERIVED_KEYS
                and key not in block.graph._cache.get(DERIVED_KEYS, ())]


class BlockStepCapture:
    """``step = BlockStepCapture(step_fn, optimizers=[opt], modules=[model]); loss = step(batch)``.

    ``step_fn(batch)`` is one whole training step on a loader's `MiniBatch` (zero the
    gradients, forward over ``batch.blocks``, loss, backward, ``optimizer.step()``)
    returning tensors. Padded batches (a ``NeighborLoader(static_shapes=True)``) are
    captured and replayed as the module doc says; any other batch (unpadded, or not a
    `MiniBatch`) runs ``step_fn`` eagerly, as given (``mode="on"`` says so once).
    Deferred batches (``NeighborLoader(..., deferred=True)``) get their feature
    rows from ``features`` (``loader.features``) and their layouts built inside the step
    (`loader.static_shapes.complete`), so the graph replays those too. ``mode``,
    ``warmup`` and the optimizer rules (Adam with ``capturable=True``) are
    `StepCapture`'s; ``replayed`` and ``eager`` count the steps run each way, and
    `status` says which and why. ``short_batches``: ``"eager"`` runs a batch with fewer
    seeds (the epoch's last) eagerly; ``"replay"`` replays it, for a ``step_fn`` whose
    loss reads the seeds only as rows ``[:batch.batch_size]`` of the output and of
    ``batch.y`` and ignores ``IGNORE_LABEL`` rows (`classification_step`'s; the module
    doc says why that gives the short batch's loss and gradients).
    """

    def __init__(self, step_fn: Callable[[MiniBatch], Any], *, optimizers: Sequence[torch.optim.Optimizer] = (),
                 modules: Sequence[torch.nn.Module] = (), mode: str = "auto", warmup: int = DEFAULT_WARMUP,
                 features: torch.Tensor | None = None, short_batches: str = "eager",
                 _graph_factory: Callable[[], Any] | None = None):
        if short_batches not in SHORT_BATCHES:
            raise ValueError(f"short_batches must be one of {', '.join(map(repr, SHORT_BATCHES))}, "
                             f"got {short_batches!r}")
        self.step_fn, self.optimizers, self.modules = step_fn, list(optimizers), list(modules)
        self.short_batches = short_batches
        self.features = features
        self.mode, self.warmup, self._graph_factory = check_mode(mode), check_warmup(warmup), _graph_factory
        self.static: StaticBatch | None = None
        self._capture: StepCapture | None = None
        self.reason: str | None = "disabled (mode 'off')" if mode == "off" else None
        self._verified = False
        self.replayed = self.eager = 0
        self._skipped: set[str] = set()
        self._rows_unwatched = True       # the first padded batch of blocks' step runs under RowMixingWatch
        mixing = self._row_mixing = row_mixing_module(self.modules)     # mode "off" pads batches too
        if mixing and self.reason is None:
            reason = f"{mixing} normalises over all rows, which would count the padded ones"
            if (mode == "auto" and _graph_factory is None      # (a test's stand-in graph needs no device)
                    and step_device(self.optimizers, self.modules, ()).type != "cuda"):
                self.reason = reason        # "auto" runs eagerly on a CPU without a word, as StepCapture does
            else:
                self._fall_back(reason)

    @property
    def status(self) -> str:
        if self.reason:
            return f"eager: {self.reason}"
        if self._capture is None and self._skipped:
            return f"eager so far: {', '.join(sorted(self._skipped))}"
        return self._capture.status if self._capture is not None else "warming up"

    def release(self) -> None:
        """Drop the captured graph (`StepCapture.release`: before the process group of a
        step that all-reduces in it); later batches run eagerly."""
        if self._capture is not None:
            self._capture.release()
            self._capture = None
        if self.reason is None:
            self.reason = "released (BlockStepCapture.release)"

    _STEP = "mini-batch training step"      # how warnings and the capture name the step
    _CACHED_REMEDY = "build it in the loader (loader.layouts) to capture this step"
    _UNPADDED = "its batch is not padded (NeighborLoader(..., static_shapes=True) pads them)"

    def __call__(self, batch: Any) -> Any:
        if self._rows_unwatched and isinstance(batch, MiniBatch) and batch.padded:
            # ``modules=`` may leave out what mixes rows: the first padded step refuses it as it calls it
            self._rows_unwatched = False
            with RowMixingWatch(refuse=PADDED_BLOCKS_REMEDY):
                return self._step(batch)
        return self._step(batch)

    def _step(self, batch: Any) -> Any:
        if self.reason is None and self._padded(batch) and self.static is None:
            self._check_device(batch)
        if self.reason is None and self._padded(batch):
            if self.static is None:
                self.static = self._static_batch(batch)
                static = self.static
                self._capture = StepCapture(lambda: self.step_fn(static.complete()), optimizers=self.optimizers,
                                            modules=self.modules, mode=self.mode, warmup=self.warmup,
                                            name=self._STEP, _graph_factory=self._graph_factory)
            problem = self.static.load(batch, short=self.short_batches == "replay")
            if problem is None:
                return self._run_captured()
            self._note_skip(problem)
        elif self.reason is None:
            self._note_skip(self._UNPADDED)
        self.eager += 1
        return self._eager_step(batch)

    def _check_device(self, batch: Any) -> None:
        """Run every batch eagerly, as given, off a CUDA device: CUDA graphs need one.
        Asked before the first padded batch is loaded into the static one, which would
        otherwise run its step on that padded copy before `StepCapture` found the device
        (on a CPU the second batch of a graph-classification epoch ran on its padded copy,
        and a step counting ``batch.num_graphs`` gave other numbers for it alone)."""
        if self._graph_factory is not None:      # a test's stand-in graph: no device needed
            return
        device = step_device(self.optimizers, self.modules,      # (a MiniBatch's edge_index is built when read)
                             (getattr(batch, name, None) for name in ("n_id", "x", "edge_index")))
        if device.type != "cuda":
            self.reason = f"CUDA graphs need a CUDA device; the step runs on {device}"
            if self.mode == "on":
                warnings.warn(f"gnnfuse: the {self._STEP} is not captured in a CUDA graph and runs eagerly: "
                              f"{self.reason}", CaptureFallbackWarning, stacklevel=3)

    def _padded(self, batch: MiniBatch) -> bool:
        return getattr(batch, "padded", False) is True     # a MiniBatch's; any other batch runs eagerly

    def _static_batch(self, batch: MiniBatch) -> StaticBatch:
        return StaticBatch(batch, self.features)

    def _eager_step(self, batch: MiniBatch) -> Any:
        if not isinstance(batch, MiniBatch):
            return self.step_fn(batch)
        if self._row_mixing and batch.padded:
            raise ValueError(f"{self._row_mixing} normalises over all rows, {PADDED_BLOCKS_REMEDY}")
        if batch.deferred and self.features is None:
            raise ValueError("a deferred batch (NeighborLoader(deferred=True)) needs the feature table its rows come "
                             "from: BlockStepCapture(..., features=loader.features)")
        return self.step_fn(complete(batch, self.features) if batch.deferred else batch)

    def _run_captured(self) -> Any:
        replay = self._capture.captured
        result = self._capture()
        if replay:
            self.replayed += 1
            return result
        self.eager += 1
        if self._capture.reason:            # StepCapture runs it eagerly from now on (and said why)
            self.reason = self._capture.reason
        elif self._capture.captured or not self._verified:
            # a warm-up step, or the one that also captured: did any step cache on the graphs?
            self._verified = self._capture.captured
            self._check_sealed()
        return result

    def _check_sealed(self) -> None:
        added = self.static.added_cache_keys()
        if added and self.reason is None:
            self._capture = None
            self._fall_back(f"the step cached {', '.join(added)} on a batch's graph, which a replay would reuse "
                            f"from the first batch; {self._CACHED_REMEDY}")

    def _note_skip(self, problem: str) -> None:
        """A padded batch that runs eagerly (e.g. the epoch's smaller last batch): said once per reason."""
        if problem not in self._skipped and self.mode == "on":
            warnings.warn(f"gnnfuse: a {self._STEP} runs eagerly: {problem}", CaptureFallbackWarning, stacklevel=3)
        self._skipped.add(problem)

    def _fall_back(self, reason: str) -> None:
        self.reason = reason
        if self.mode != "off":
            warnings.warn(f"gnnfuse: the {self._STEP} is not captured in a CUDA graph and runs eagerly: "
                          f"{reason}", CaptureFallbackWarning, stacklevel=3)


class GraphStepCapture(BlockStepCapture):
    """``step = GraphStepCapture(step_fn, optimizers=[opt], modules=[model]); loss = step(batch)``.

    `BlockStepCapture` for batches of whole graphs (graph classification): ``step_fn(batch)``
    is one training step on a PyG ``Batch`` from ``gnnfuse.loader.DataLoader(...,
    static_shapes=True)``, passing ``batch.edge_index`` to the model and
    ``size=batch.num_graphs`` to PyG's pooling (without it the pooling reads the graph
    count back from the device, which keeps the step eager). Padded batches are copied
    into the captured one and replayed (`training.static_graph_batch`), every other one
    runs ``step_fn`` eagerly, on the batch as PyG's ``DataLoader`` collated it (a padded
    one `unpadded`: the step then gives PyG's numbers whatever it computes, a model
    normalising over all rows included); a batch of fewer graphs (the epoch's last) has
    the same padded shapes and replays. ``mode``, ``warmup``, the optimizer rules (Adam with
    ``capturable=True``) and the refusal of models normalising over all rows are
    `BlockStepCapture`'s; the first padded batch's step (below) also looks for such a
    module among every module it calls, ``modules=`` or not, and for a functional batch
    norm (`RowMixingWatch`).

    The padding graphs' labels are `IGNORE_LABEL`, which only cross-entropy and nll (by
    their default ``ignore_index``, reduced by ``"mean"`` or ``"sum"``) ignore: the first
    padded batch runs eagerly on PyG's batch while `training.label_use.LabelWatch`
    follows ``batch.y`` through the step, and a step computing anything else from it
    (``y.float()`` for a binary loss, a mean of ``pred == y``, cross-entropy with
    ``reduction="none"``) runs eagerly from then on, with a warning naming the op. With
    masked labels (``DataLoader(static_shapes=True, label_mask=True)``: a regression's
    float ``y``) the watch follows ``batch.y`` until the step multiplies it by
    ``batch.y_mask`` instead (`training.label_use`).

    What is not checked: the replayed step runs on padded batches, whose ``num_graphs``,
    ``num_nodes`` and ``ptr`` count the padding, so a step using them as numbers (a summed
    loss divided by ``batch.num_graphs``), a target under another name than ``y``
    (padded with zeros, which a loss counts as class 0 or as a target; only ``y`` is
    padded with `IGNORE_LABEL`) or a term reduced over all rows of the output
    (a penalty on the pooled rows' mean, which counts the padding graphs') gives other
    numbers than on PyG's batch.
    """

    _STEP = "graph training step"
    # a graph DataLoader builds no layouts: what layers rebuild per step is padded_loops'
    _CACHED_REMEDY = ("a replayed step rebuilds in fixed shapes only the self loops of GCN's normalisation and of "
                      "GATConv, without edge weights or edge features (nn.padded_loops); a step deriving anything "
                      "else from the batch's graph runs eagerly")
    _UNPADDED = "its batch is not a padded graph batch (DataLoader(..., static_shapes=True) pads them)"

    def __init__(self, step_fn: Callable[[Any], Any], *, optimizers: Sequence[torch.optim.Optimizer] = (),
                 modules: Sequence[torch.nn.Module] = (), mode: str = "auto", warmup: int = DEFAULT_WARMUP,
                 _graph_factory: Callable[[], Any] | None = None):
        super().__init__(step_fn, optimizers=optimizers, modules=modules, mode=mode, warmup=warmup,
                         _graph_factory=_graph_factory)
        self._labels_watched = False

    def __call__(self, batch: Any) -> Any:
        first = self.reason is None and not self._labels_watched and self._padded(batch)
        if first:
            self._check_device(batch)        # off a GPU, no capture: nothing to say about the labels
        if first and self.reason is None:
            # the first padded batch runs eagerly, unpadded, to see what the step makes of
            # its labels: anything but a loss ignoring IGNORE_LABEL would count the padding
            self._labels_watched = True
            plain = unpadded(batch)
            masks = [plain[key] for key in MASK_KEYS if key in plain]
            with LabelWatch([plain[key] for key in LABEL_KEYS if key in plain], masks) as watch, \
                    RowMixingWatch() as mixing:
                result = self._eager_step(plain)
            self.eager += 1
            if mixing.found is not None:       # what ``modules=`` left out (its own were checked)
                self._fall_back(f"{mixing.found} normalises over all rows, which would count the padded ones (the "
                                f"step calls it; a module passed as modules=[...] is seen when the capture is made)")
            elif watch.mask_use is not None:
                self._fall_back(f"the step computes {watch.mask_use}, which a padded batch's padding rows (0 in "
                                f"batch.y_mask) change; so a padded batch's step would not give the plain batch's "
                                f"numbers: reduce the mask by a sum, (loss * batch.y_mask).sum() / batch.y_mask.sum()")
            elif watch.unmaskable is not None:
                self._fall_back(f"the step computes {watch.misuse} from batch.y, {watch.unmaskable}; so a padded "
                                f"batch's step would not give the plain batch's numbers")
            elif watch.misuse is not None and masks:
                self._fall_back(f"the step computes {watch.misuse} of batch.y before multiplying it by batch.y_mask, "
                                f"which is 0 on a padded batch's padding rows: multiply the loss terms by it before "
                                f"reducing them, (F.mse_loss(out, batch.y, reduction='none') * batch.y_mask).sum() "
                                f"/ batch.y_mask.sum()")
            elif watch.misuse is not None:
                self._fall_back(f"the step computes {watch.misuse} of batch.y, which on a padded batch holds "
                                f"IGNORE_LABEL ({IGNORE_LABEL}) for the padding: only cross_entropy and nll_loss "
                                f"with ignore_index={IGNORE_LABEL}, reduced by 'mean' or 'sum', ignore it")
            return result
        return super().__call__(batch)

    def _padded(self, batch: Any) -> bool:
        return padded_capacities(batch) is not None

    def _static_batch(self, batch: Any) -> StaticGraphBatch:
        return StaticGraphBatch(batch)

    def _eager_step(self, batch: Any) -> Any:
        # as PyG collated it: a step refused for mixing rows would count the padded ones
        return self.step_fn(unpadded(batch))
