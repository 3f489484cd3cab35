"""The `Graph` made for a raw index input, remembered while the input is unchanged.

A PyG script passes the same ``edge_index`` tensor to every layer on every step. The
layouts kernels need (the CSR sort, the self-looped copy, GCN's norms) are cached on a
`Graph` object, so a fresh `Graph` per call rebuilt them all every time: 2.4-3.9x the
step time of passing a `Graph` (issue #12). Here the `Graph` built for an input object
is kept and served again while that object is unchanged.

Unchanged means: the very same Python object (checked through a weak reference, so a
new tensor that reuses a freed one's id and address is not mistaken for it), and every
tensor it holds has the same version counter, data pointer, shape, strides, dtype and
device. Every in-place torch
op bumps the version counter, views included, so an edited ``edge_index`` gets a new
`Graph`. Writes that bypass the counter -- through ``.data``, ``.numpy()`` or DLPack --
are not seen; autograd has the same blind spot. Inference-mode tensors have no version
counter, so they are never cached.

An entry lives while its input does: when the user drops the input, its graph and
layouts are dropped too (builders must not keep the input object alive, only its
memory: see `Graph._from_torch`), so a loop that makes a new ``edge_index`` per epoch
does not pile up graphs on the GPU. The cache is also bounded (`CAPACITY` entries, least
recently used evicted first): a training loop needs one entry per graph (per edge type
for ``to_hetero``). The exception
is an input held for matching by contents (below): it and its graph stay until another
input of its shape differs from it, `CONTENT_CAPACITY` other shapes are held after it,
or `clear_index_cache` runs.

Nothing built inside a ``torch.func`` transform (grad, vmap, jacrev, ...) is kept: every
tensor made there, the layouts built from a plain ``edge_index`` included, is the
transform's wrapper, which outlives it unusable (the Triton kernels cannot read its
storage). A failed ``torch.func.grad`` call kept such a graph for its ``edge_index``, and
every later plain call on that ``edge_index`` failed with "Cannot access storage of
TensorWrapper".

An owner that knows the graph of an input can hand it over (`remember`: a loader batch's
``edge_index``, whose graph it builds from its blocks), and the graphs of its column
prefixes too (`remember_prefixes`): PyG's ``trim_to_layer`` gives each layer a view of the
batch's first edges (``edge_index.narrow(1, 0, k)``), a new tensor per layer and step,
which a view of that tensor's memory, strides and version is matched to.

A new tensor with the contents of one seen before gets that one's graph too, where a
layer evidently makes one per call: PyG's ``ClusterGCNConv`` and ``PDNConv`` (and any
layer calling ``add_self_loops`` in its forward) derive a fresh ``edge_index`` from the
user's on every call, so every call sorted two CSRs and cut their segments again, some
240 launches and 19 host syncs, which made both layers slower than PyG on an
arxiv-sized graph (0.81x, 0.80x; H200). A plain ``edge_index`` missed by identity
whose shape (with dtype, device and ``key``) missed recently too has a private copy of
its contents held (`_held_for_contents`); a later miss of that shape compares its
contents with the copy by ``torch.equal`` (exact; one host sync) and, if they are
equal, gets the graph built over the copy (built on the first such match, then shared).
A comparison that fails marks the shape as one whose inputs change (a loader's
fixed-shape batches) and it is not compared again. Nothing is compared while a CUDA
graph is being captured or inside a ``torch.func`` transform.

The copy is the point: no user tensor is ever shared between inputs. The graph lent
was once the first input's own, reading that input's memory, which a write that moves
no version counter could change under it (numpy's, into a ``torch.from_numpy`` buffer a
loader refills): every tensor that had borrowed it, a validation ``edge_index`` never
written included, then got the refilled batch's edges under layouts of the old ones
(SAGEConv 4.3 and GAT 3.2 off PyG's outputs); and its edit checks watched the lender,
so an edit to the lender raised at a borrower's backward, naming a tensor that
borrower never used. A copy nobody else can reach cannot change, and it describes
exactly the contents it is compared with.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable

import torch

# One entry per graph a step uses: one for a homogeneous model, one per edge type for a
# model made heterogeneous by ``to_hetero`` (each relation's layer gets its own
# ``edge_index``). At 8, a model with 12 edge types missed on every layer call -- 24 graph
# builds, two CSR sorts each, per forward -- as a cyclic access evicts each entry before
# its reuse. Entries die with their inputs, so the bound only limits the layouts of inputs
# the user still holds.
CAPACITY = 64

# The innermost torch.func transform's interpreter, None outside every transform: one C
# call, cheap enough for a check on every program call (runtime/compiled.py).
functorch_interpreter: Callable[[], Any] = torch._C._functorch.peek_interpreter_stack

# slot -> (weak reference to the input, its stamp, its graph[, the storages its stamp read])
_ENTRIES: OrderedDict[tuple[int, Hashable], tuple] = OrderedDict()

# Matching by contents (see the module docstring), keyed by `_shape_key`: the shapes that
# missed lately, the private copies held with the graph built over them (a one-item
# list, None until a match needs it), and the shapes whose inputs were found to change
# (never compared again).
CONTENT_CAPACITY = 4
_RECENT_MISSES: OrderedDict[Hashable, None] = OrderedDict()
_HELD: OrderedDict[Hashable, tuple[list[torch.Tensor], list]] = OrderedDict()
_CHANGING: OrderedDict[Hashable, None] = OrderedDict()
# One thread at a time reads or changes the tables (never around a build): two threads
# coercing their own edge_index tensors evicted each other's entries between a lookup
# and its move_to_end, a KeyError out of Graph.coerce. Re-entrant: a weak reference's
# callback (`_forget`) may run inside a locked section when the collector frees an input.
_LOCK = threading.RLock()
# `remember_prefixes`: id of a tensor's root -> (weak reference to the tensor, its stamp,
# the builders by (columns, key), the graphs built so far)
_PREFIXES: OrderedDict[int, tuple[weakref.ref, tuple, dict, dict]] = OrderedDict()


def cached_graph(obj: Any, parts: list[torch.Tensor], key: Hashable,
                 build_over: Callable[[list[torch.Tensor]], Any]) -> Any:
    """``build_over(parts)`` for ``obj``, or the result of an earlier call for the same
    object in the same state. ``parts`` are the tensors holding ``obj``'s indices (the
    tensor itself, or a sparse tensor's components) whose stamps decide "the same state";
    ``key`` adds what else the result depends on (the requested vertex count).
    ``build_over`` builds the graph of any tensors laid out as ``parts`` (a held private
    copy of them included: see the module docstring)."""
    stamp = _stamp(parts)
    if stamp is None:
        return build_over(parts)
    slot = (id(obj), key)
    with _LOCK:
        entry = _ENTRIES.get(slot)
        if entry is not None and entry[0]() is obj and entry[1] == stamp:
            _ENTRIES.move_to_end(slot)
            return entry[2]
    if functorch_interpreter() is not None:     # its tensors are the transform's: see the module docstring
        return build_over(parts)
    if _PREFIXES and type(obj) is torch.Tensor and obj._base is not None:
        found = _prefix_graph(obj, key)
        if found is not None:       # kept for this view as a graph built for it would be
            ref = weakref.ref(obj, lambda dead: _forget(slot, dead))
            with _LOCK:
                put_recent(_ENTRIES, slot, (ref, stamp, found), CAPACITY)
            return found
    shape = _shape_key(obj, parts, key)
    with _LOCK:
        held = _equal_contents(shape, parts) if shape is not None else None
    if held is None:
        graph = build_over(parts)
    else:
        copies, lent = held
        if lent[0] is None:         # the first match: the graph of the copy, shared from now on
            lent[0] = build_over(copies)
        graph = lent[0]
    try:
        ref = weakref.ref(obj, lambda dead: _forget(slot, dead))
    except TypeError:      # an object without weak references: not cached
        ref = None
    with _LOCK:
        if held is None and shape is not None:
            _held_for_contents(shape, parts)
        if ref is not None:
            # the storages the stamp's addresses point into, kept while the entry lives: a
            # graph that copied its input (int32, strided) no longer held them, so after
            # ``edge_index.data = new`` the allocator could give ``new`` the freed address,
            # and a stamp of equal version, address and shape served the old graph (1.9 off
            # PyG's SAGEConv)
            storages = tuple([t.untyped_storage() for t in parts])
            put_recent(_ENTRIES, slot, (ref, stamp, graph, storages), CAPACITY)
    return graph


def remember_prefixes(obj: torch.Tensor, prefixes: dict[tuple[int, Hashable], Callable[[], Any]]) -> None:
    """Serve, for a view of ``obj``'s first ``k`` columns (``obj.narrow(1, 0, k)``, what
    PyG's ``trim_to_layer`` hands each layer) under ``key``, the graph
    ``prefixes[(k, key)]()`` builds (once), while ``obj`` is unchanged. Only for an owner
    that knows those graphs, as `remember`'s: a loader batch's ``edge_index``, whose hops
    come in order (`loader.pyg_batch`). A view matches by its root tensor, address,
    strides and row count; it shares ``obj``'s version counter, so an edit through
    either shows in the stamp."""
    stamp = _stamp([obj])
    if stamp is None:
        raise ValueError("an inference tensor has no version counter: its graphs cannot be remembered")
    slot = id(_root(obj))
    ref = weakref.ref(obj, lambda dead: _forget_prefixes(slot, dead))
    with _LOCK:
        put_recent(_PREFIXES, slot, (ref, stamp, dict(prefixes), {}), CAPACITY)


def _root(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor whose memory ``tensor`` views (itself if it is no view): every view of
    one tensor, a view of a view included, has that tensor as its ``_base``."""
    return tensor if tensor._base is None else tensor._base


def _prefix_graph(obj: torch.Tensor, key: Hashable) -> Any:
    """The graph `remember_prefixes` holds for ``obj`` under ``key`` if ``obj`` is a
    column prefix of a tensor it was given, that tensor unchanged; else None."""
    root = _root(obj)
    with _LOCK:
        entry = _PREFIXES.get(id(root))
    if entry is None:
        return None
    ref, stamp, builders, built = entry
    base = ref()
    if (base is None or _root(base) is not root or _stamp([base]) != stamp
            or obj.dim() != 2 or obj.shape[0] != base.shape[0] or obj.data_ptr() != base.data_ptr()
            or obj.stride() != base.stride()):
        return None
    wanted = (obj.shape[1], key)
    if wanted not in builders:
        return None
    if wanted not in built:
        built[wanted] = builders[wanted]()
    return built[wanted]


def remember(obj: torch.Tensor, key: Hashable, graph: Any) -> None:
    """Serve ``graph`` for the plain index tensor ``obj`` (under ``key``, as
    `cached_graph`'s) in the state it is in now. Only for an owner that rewrites ``obj``
    in place together with every layout of ``graph`` and calls this after each rewrite:
    a captured step's static batch (`training.static_graph_batch`), whose kernels read
    the graph's layouts at fixed addresses, so a graph built anew per batch would not be
    the one they read."""
    stamp = _stamp([obj])
    if stamp is None:
        raise ValueError("an inference tensor has no version counter: its graph cannot be remembered")
    slot = (id(obj), key)
    ref = weakref.ref(obj, lambda dead: _forget(slot, dead))
    with _LOCK:
        put_recent(_ENTRIES, slot, (ref, stamp, graph), CAPACITY)


def clear_index_cache() -> None:
    """Forget every remembered graph (and free its layouts)."""
    with _LOCK:
        for table in (_ENTRIES, _RECENT_MISSES, _HELD, _CHANGING, _PREFIXES):
            table.clear()


def _shape_key(obj: Any, parts: list[torch.Tensor], key: Hashable) -> Hashable | None:
    """What an input must share with a held one to be compared with it, or None where
    inputs are not matched by contents: anything but a plain dense index tensor (an
    ``EdgeIndex``'s graph also reads its flags; a sparse adjacency's, its size, which its
    index and value tensors do not hold), and any call while a CUDA graph is being
    captured (a comparison reads back, which capture forbids)."""
    if type(obj) is not torch.Tensor or obj.layout is not torch.strided:
        return None
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None
    return key, tuple((tuple(t.shape), t.dtype, t.device) for t in parts)


def _equal_contents(shape: Hashable, parts: list[torch.Tensor]) -> tuple[list[torch.Tensor], list] | None:
    """(private copies, [their graph or None]) held for an input of ``shape`` whose
    contents equal ``parts``', else None."""
    held = _HELD.get(shape)
    if held is None:
        return None
    if all(torch.equal(a, b) for a, b in zip(parts, held[0])):
        _HELD.move_to_end(shape)
        return held
    del _HELD[shape]
    put_recent(_CHANGING, shape, None, 16 * CONTENT_CAPACITY)
    return None


def _held_for_contents(shape: Hashable, parts: list[torch.Tensor]) -> None:
    """Hold a private copy of ``parts`` for comparison if their shape missed lately (a
    layer making an ``edge_index`` per call misses on every call; a one-off input is not
    copied). Copied outside inference mode, so a graph built over the copy can seal it."""
    if shape in _CHANGING:
        return
    if shape in _RECENT_MISSES:
        with torch.inference_mode(False):
            copies = [t.detach().clone() for t in parts]
        put_recent(_HELD, shape, (copies, [None]), CONTENT_CAPACITY)
    put_recent(_RECENT_MISSES, shape, None, 16 * CONTENT_CAPACITY)


def put_recent(table: OrderedDict, key: Hashable, value: Any, capacity: int) -> None:
    """``table[key] = value`` as the most recent entry, the least recent ones evicted
    beyond ``capacity``: every table of this module and `hetero_cache` is bounded so."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > capacity:
        table.popitem(last=False)


def _forget_prefixes(slot: int, dead: weakref.ref) -> None:
    """Drop the prefixes of a tensor that was just freed (`_forget`)."""
    _forget(slot, dead, _PREFIXES)


def _forget(slot: Hashable, dead: weakref.ref, table: OrderedDict | None = None) -> None:
    """Drop the entry of an input that was just freed from ``table`` (default the
    entries), unless the slot was reused; nothing at the interpreter's exit, whose
    teardown of this module may come first (clearing its globals in any order: the lock
    may outlive the tables, and an AttributeError on None was printed at exit)."""
    table = _ENTRIES if table is None else table
    if _LOCK is None or table is None:
        return
    with _LOCK:
        entry = table.get(slot)
        if entry is not None and entry[0] is dead:
            del table[slot]


def _stamp(parts: list[torch.Tensor]) -> tuple | None:
    """What changes when a tensor's contents may have changed; None if not trackable."""
    try:
        if len(parts) == 1:     # a plain edge_index (every layer call stamps it): no generator
            t = parts[0]
            return ((t._version, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device),)
        return tuple((t._version, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device) for t in parts)
    except RuntimeError:   # an inference tensor: no version counter
        return None
