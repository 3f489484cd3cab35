"""Graphiler's broadcast reordering (§4.3.1): ``f(broadcast(x))`` becomes
``broadcast(f(x))`` when ``f`` is a dense op, so ``edges.src['h'] @ W`` costs |V| rows
of matmul instead of |E|. The same holds for a per-node-type matmul on an endpoint's
data: ``edges.src['h'] @ edges.srctype['W']`` depends only on the source vertex, so it
is computed per vertex with the vertex's type (HGT's per-type projections).

A moved op runs on every vertex row, also on rows no edge reads, and its backward runs
there on an exact zero gradient. Eager code never touches those rows, so they must get
exact zeros, and ``sqrt'(0) * 0`` or ``exp(800)' * 0`` would be NaN: an op whose
derivative can be infinite at finite operands (`OpDef.bounded_derivative` False) reads
its floating-point rowed operands with the unread rows set to 1 (``select`` by the
broadcast's degree), a point where each such op is finite with a finite derivative; the
select's own derivative gives those rows exact zeros whatever the op computed there.
Bounded ops (products, matmuls, activations: GCN's ``u.h * u.norm``) move unmasked, at no
cost: with finite features their unread rows' gradients are exact zeros already. A NaN
*feature* on such a row can still meet a zero gradient in a partner operand's (a weight's)
gradient, as in PyG's own transform-first layers; the README says so. The PyG front end,
whose oracle computes such products per edge, masks them (`mask_unread_rows_of_gathered_products`)."""
from __future__ import annotations

import math

from ..ir import Movement, Program, Residency, get_op


def reorder_broadcasts(program: Program) -> Program:
    """Move pure dense ops above the broadcast that feeds them, until none can move.

    An op moves when every operand that has rows is a broadcast along the same index
    (the others are SHARED): then it computes the same rows before the gather.
    """
    changed = True
    while changed:
        changed = False
        for v in list(program.values):
            if _reorder_typed_matmul(program, v):
                changed = True
                continue
            if v.op == "input" or v.movement is not Movement.DENSE or not get_op(v.op).pure:
                continue
            if not _constants_commute(v):
                continue
            rowed = [i for i in v.inputs if i.residency is not Residency.SHARED]
            if not rowed or any(i.op != "broadcast" for i in rowed):
                continue
            by = {i.attrs["by"] for i in rowed}
            if len(by) != 1:
                continue
            by = by.pop()
            inner = [i.inputs[0] if i.op == "broadcast" else i for i in v.inputs]
            if unbounded_derivative(v.op):
                inner = [read_rows_only(program, i, by, v.source)
                         if i.residency is not Residency.SHARED and i.dtype.is_floating_point else i
                         for i in inner]
            moved = program.add(v.op, *inner, source=v.source, **v.attrs)
            gathered = program.add("broadcast", moved, source=v.source, by=by)
            program.replace_uses(v, gathered)
            changed = True
    return program


def mask_rows_only_gathers_read(program: Program) -> None:
    """Vertex values computed before any move whose every use is a gather (``broadcast``,
    directly or through row-wise ops) get the moved ops' treatment: an op whose
    derivative can be infinite reads its rowed floating-point operands as 1s on the rows
    the gather never reads. A vertex function builds such values itself: ``torch.sqrt(v.d)``
    inside the loop over ``v.innbs`` is a per-vertex op gathered onto in-edges, which eager
    code (one vertex at a time) never evaluates, or never connects to the output, on a vertex
    without in-edges -- its gradient there is 0, where the compiled backward gave
    ``sqrt'(0) * 0 = NaN`` (d.grad NaN on an isolated vertex with d = 0). The rows the gather
    reads keep their values, and the rows it does not read reach nothing. The vertex front
    end runs it on its trace (other front ends gather before computing, so
    `reorder_broadcasts` masks what it moves; running it on every program would also add
    selects to backward programs, e.g. SAGE's gradient divided by the clamped degree)."""
    users = program.live_users()
    outputs = {v.id for v in program.outputs.values()}
    gathered_by: dict[int, str] = {}        # value id -> the one gather its rows reach only through
    for v in reversed(program.values):
        if v.residency is not Residency.NODE or v.id in outputs or not users.get(v.id):
            continue
        reached = {u.attrs["by"] if u.op == "broadcast"
                   else gathered_by.get(u.id) if u.residency is Residency.NODE and u.movement is Movement.DENSE
                   else None for u in users[v.id]}
        if len(reached) == 1 and (by := reached.pop()) in ("src", "dst"):
            gathered_by[v.id] = by
    changed = False
    for v in list(program.values):
        by = gathered_by.get(v.id)
        if by is None or v.op == "input" or v.movement is not Movement.DENSE or not unbounded_derivative(v.op):
            continue
        masked = tuple(read_rows_only(program, i, by, v.source)
                       if i.residency is Residency.NODE and i.dtype.is_floating_point else i for i in v.inputs)
        if masked != v.inputs:
            v.inputs, changed = masked, True
    if changed:         # once: the loop walks a copy of the values, and the masks are new values
        program.toposort()


def mask_unread_rows_of_gathered_products(program: Program) -> None:
    """A product of gathered rows and a parameter (``lin(x_j)``, ``x_j * att``,
    ``(x_j - x_i) @ u``) in a PyG ``message`` reads its rows as 0 on vertices the gather
    never reads: `reorder_broadcasts` (after `distribute_products`) moves such a product
    above the gather, onto every vertex row, and the parameter's gradient ``x^T g`` then met
    a NaN or inf feature of a vertex the gather never reads (an isolated one) with that
    row's exact zero gradient (``0 * NaN``): NaN where PyG, which computes the product per
    edge, gives a number (GeneralConv's ``lin_msg.weight``, FeaStConv's ``lin.weight`` and
    ``u.weight`` without self loops). The gather itself reads the same values, and ``x``'s
    gradient is an exact zero on the other rows, as in PyG. Only the PyG front end runs
    it: the vertex and message/reduce front ends document that leak and keep their moved
    products unmasked, at no cost.

    The mask is ``zero_unread_rows``, not an elementwise select: its input feeds a product
    (a GEMM, no fused kernel), so a select wrote a masked copy of the input per call and
    side, which the product saved for its gradient -- on the reddit2-sized graph (233K x
    602) FeaStConv's two sides cost 1.1 GB of peak and 6 % of its time on an H100
    (benchmarks/results/ab_2026-12-05_h100). ``zero_unread_rows`` zeroes the unread rows
    by index, and is the input itself on a graph that reads every row (self loops)."""
    masked: set[int] = set()
    for v in list(program.values):
        if v.op not in ("matmul", "mul") or len(v.inputs) != 2:
            continue
        if not any(i.residency is Residency.SHARED and i.op != "const" for i in v.inputs):
            continue
        for rowed in v.inputs:
            terms = rowed.inputs if rowed.op in ("add", "sub") else (rowed,)
            for gather in terms:
                rows = gather.inputs[0] if gather.op == "broadcast" else None
                if (rows is None or gather.id in masked or rows.residency is not Residency.NODE
                        or not rows.dtype.is_floating_point):
                    continue
                gather.inputs = (program.add("zero_unread_rows", rows, source=v.source, by=gather.attrs["by"]),)
                masked.add(gather.id)
    if masked:          # once: the masks are new values, added after the gathers reading them
        program.toposort()


def _constants_commute(v) -> bool:
    """Whether ``v``'s constant operands let it move: each is finite, and a divisor is
    nonzero. Moved, the backward of ``x * c`` scales the sum of a vertex's out-edge
    gradients once, ``c * sum(g)``, where eager code sums ``c * g`` per edge. That is the
    same number for a finite ``c``; for ``c = -inf`` a vertex whose out-edges' gradients
    differ in sign got +inf where eager code gets NaN (inf - inf), and a vertex sending
    no edge got ``-inf * 0 = NaN`` where eager code gets 0. ``x / 0.0`` is the same
    product with ``1 / c`` infinite. Such an op stays per edge."""
    for n, x in enumerate(v.inputs):
        if x.op != "const":
            continue
        value = x.attrs["value"]
        if not math.isfinite(value) or (v.op == "div" and n == 1 and value == 0):
            return False
    return True


def unbounded_derivative(op: str) -> bool:
    """Whether ``op``'s derivative can be infinite at finite operands (a differentiable op
    whose `OpDef.bounded_derivative` is False): the ops whose operands read 1 on rows eager
    code never evaluates (see the module docstring)."""
    opdef = get_op(op)
    return opdef.derivative is not None and not opdef.bounded_derivative


def read_rows_only(program: Program, x, by: str, source: str | None):
    """``x`` with the rows the broadcast by ``by`` never reads set to 1 (see the module
    docstring): ``select(degree, x, 1)``, elementwise, so it fuses into the kernel of the
    op it guards; ``by="dst"`` reads the rows of vertices with in-edges, those a
    message/reduce ``reduce_fn`` runs on."""
    read = program.add("degree", source=source, by=by, dtype=x.dtype)
    one = program.add("const", source=source, value=1.0, dtype=x.dtype)
    return program.add("select", read, x, one, source=source)


_ENDPOINT_TYPE = {"srctype": "src", "dsttype": "dst"}


def _reorder_typed_matmul(program: Program, v) -> bool:
    """``typed_matmul(broadcast(x, src), W, by=srctype)`` -> ``broadcast(typed_matmul(x, W,
    by=ntype), src)`` (and likewise for dst); returns whether it rewrote ``v``."""
    if v.op != "typed_matmul" or v.attrs["by"] not in _ENDPOINT_TYPE:
        return False
    x, w = v.inputs
    side = _ENDPOINT_TYPE[v.attrs["by"]]
    if x.op != "broadcast" or x.attrs["by"] != side:
        return False
    moved = program.add("typed_matmul", x.inputs[0], w, source=v.source, by="ntype")
    program.replace_uses(v, program.add("broadcast", moved, source=v.source, by=side))
    return True
