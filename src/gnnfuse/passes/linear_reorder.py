"""Linear-operator reordering of relation-typed aggregations (Hector, ASPLOS '24), and with
it Seastar's hierarchical aggregation (§6.3.5).

After compact materialization (passes/compact.py) R-GCN's flat program reads

    reduce(s_e * compact_typed_matmul(x, W, side=src), op=sum|mean, by=dst)

-- every edge's message is its source row times its relation's matrix, scaled by at most
a scalar per edge (the per-relation mean's ``1 / |N_r(v)|``, an edge weight), summed or
averaged over the destination's in-edges. The aggregation is linear and each ``W_r`` is
linear, so the transform may run after the aggregation instead: sum the raw scaled rows
per (destination, relation) pair, multiply each partial by ``W_r`` once, then sum the
partials across relations -- the hierarchical form (per-type partial aggregation, then
across types). This pass rewrites the pattern into one ``typed_aggregate`` op
(ir/ops/typed_aggregate.py), which picks the order per graph by its byte model, since the
pair counts it depends on are not known when the program is compiled.

It rewrites only what the algebra preserves, and leaves everything else as it was:

- the reduce is a sum, or a mean (then it is the sum divided by the destination's total
  in-degree -- never a sum or mean of per-relation means, which differ whenever a vertex's
  relations have different edge counts);
- between the typed matmul and the reduce there are only reshapes that keep the row a
  single ``out`` vector and multiplications by scalars (one per edge, or a parameter): a
  nonlinearity, a per-feature or per-head weight (attention over heads, HGT, RGAT), max
  or min would not commute with ``W_r``;
- every value on that path is used only by the next one (otherwise the per-edge products
  are computed anyway, and the compact form is already the cheap one);
- the matmul reads the endpoint opposite the one aggregated (a destination's own row
  times ``W_r`` summed over its in-edges is not an aggregation of other rows).
"""
from __future__ import annotations

import math

from ..ir import Program, Residency, Value
from ..ir.ops.typed_aggregate import OTHER_SIDE

COMPACT_MATMULS = ("compact_typed_matmul", "compact_indexed_matmul")
LINEAR_REDUCERS = ("sum", "mean")


def reorder_typed_linear(program: Program) -> Program:
    """Rewrite each sum or mean of a scaled compact typed matmul into ``typed_aggregate``."""
    for v in list(program.values):
        if v.op == "reduce" and v.attrs["op"] in LINEAR_REDUCERS and v.attrs["by"] in OTHER_SIDE:
            match = _match(program, v)
            if match is not None:
                program.replace_uses(v, _rewrite(program, v, *match))
    return program


def _match(program: Program, reduce: Value) -> tuple[Value, list[Value], list[Value]] | None:
    """``(typed matmul, per-edge scalars, parameter scalars)`` on the path into ``reduce``,
    or None if the path is anything but reshapes and scalar multiplications of a typed
    matmul of the other endpoint, each used only by the next."""
    users = program.users()
    outputs = {v.id for v in program.outputs.values()}
    edge_scales: list[Value] = []
    shared_scales: list[Value] = []
    v = reduce.inputs[0]
    while True:
        if len(users[v.id]) != 1 or v.id in outputs:
            return None
        if v.op == "reshape":
            v = v.inputs[0]
        elif v.op == "mul":
            scalars = [i for i in v.inputs if _is_scalar(i, reduce)]
            if len(scalars) == 2:       # a one-feature message times a scale: the scale is off the path
                scalars = [i for i in scalars if i.op not in ("reshape", "mul") + COMPACT_MATMULS]
            if len(scalars) != 1:
                return None
            scale = scalars[0]
            (shared_scales if scale.residency is Residency.SHARED else edge_scales).append(scale)
            v = next(i for i in v.inputs if i is not scale)
        elif v.op in COMPACT_MATMULS:
            one_row = math.prod(v.shape) == v.shape[-1] and math.prod(v.inputs[0].shape[:-1]) == 1
            same_dtype = v.dtype == reduce.dtype
            return (v, edge_scales, shared_scales) if (v.attrs["side"] == OTHER_SIDE[reduce.attrs["by"]]
                                                       and one_row and same_dtype) else None
        else:
            return None


def _is_scalar(v: Value, reduce: Value) -> bool:
    """One value per edge (or one in all), of the reduce's float dtype."""
    return (math.prod(v.shape) == 1 and v.dtype == reduce.dtype
            and (v.residency.is_edge_rowed or v.residency is Residency.SHARED))


def _rewrite(program: Program, reduce: Value, matmul: Value, edge_scales: list[Value],
             shared_scales: list[Value]) -> Value:
    source, by = reduce.source, reduce.attrs["by"]
    x, weight, *index = matmul.inputs
    width = x.shape[-1:]               # one row of `in` (`_match`): the op reads it flat
    x = _unreshaped(x)
    if x.shape != width:
        x = program.add("reshape", x, source=source, shape=width)
    scale = None
    for s in edge_scales:
        s = _unreshaped(s)
        scale = s if scale is None else program.add("mul", scale, s, source=source)
    if scale is not None and len(scale.shape) > 1:     # its gradient is summed to [1] or [] only
        scale = program.add("reshape", scale, source=source, shape=())
    operands = [x, weight] + ([scale] if scale is not None else []) + index
    out = program.add("typed_aggregate", *operands, source=source, by=by, scaled=scale is not None)
    for s in shared_scales:
        out = program.add("mul", out, s, source=source)
    if reduce.attrs["op"] == "mean":
        degree = program.add("degree", source=source, by=by, dtype=out.dtype)
        out = program.add("div", out, program.add("clamp_min", degree, source=source, min=1.0), source=source)
    if out.shape != reduce.shape:
        out = program.add("reshape", out, source=source, shape=reduce.shape)
    return out


def _unreshaped(v: Value) -> Value:
    """``v`` without the reshapes it was made by: a reshape keeps a row's elements in
    order, so the op may read the original row (Graphiler's ``unsqueeze(1)`` of the
    source rows, its ``[E, 1]`` norm column) and the reshapes die, instead of running
    as copies on every call."""
    while v.op == "reshape":
        v = v.inputs[0]
    return v
