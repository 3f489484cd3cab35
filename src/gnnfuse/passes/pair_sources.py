"""Run a program whose sources are read through relation matrices on the graph of
(source, relation) pairs.

Compact materialization (passes/compact.py) turns HGT's ``e.src.k @ e.type.W_k`` into
``compact_typed_matmul``: one product per (source vertex, relation) pair, gathered onto
the edges. The fused kernels then read those products as [E, F] edge rows, and the
backward writes [E, F] gradients and sums them into pairs -- on an ogbn-mag-sized graph
(21.1M edges) each such tensor is 1.35 GB at F = 16, and the gathers and sums took 11 of
the 57 ms of HGT's step on an H200.

The same program reads no [E, F] row when the pairs *are* its sources: on the pair graph
(runtime/pair_graph.py: one edge ``pair(e) -> dst(e)`` per edge of the typed graph, in the
same order and with the same type) each product is an ordinary source-side table of P
rows, which the kernels gather per edge as GAT's kernels gather a source row, and whose
gradient the backward sums over the pair graph's reverse CSR. This pass writes that
program: each ``compact_typed_matmul(x, W, side=src)`` (and ``compact_indexed_matmul`` whose
index turns out to be the graph's edge types) becomes ``broadcast(%pair, by=src)`` of a new
input, computed before the run by a segment matmul over the pairs
(``pair_matmul``, differentiable), and every other source-side input is fed its rows
gathered onto the pairs (a row-wise op commutes with the gather, so the results are the
same). A parameter table read per edge through that same index (Graphiler's HGT reads its
relation prior as ``p[edges.data['type']]``) becomes a lookup by the graph's edge type,
``broadcast(%table, by=etype)`` of the table fed as per-type data, as ``e.type.p`` is
written: its gradient is then a sum by edge type, which rides a walk of the backward
(passes/type_sums.py) instead of a scatter of a per-edge gradient into the table.

It applies only where that is exactly the program's meaning: the products read input
tables (through unit-dim reshapes at most) and per-relation weights; nothing aggregates
onto the sources (a reduce, degree or typed aggregation by src) or is output per
source; no table is read as both a source and a destination table, no node type is
read, and no relation-typed product of the destinations is taken. Otherwise the
program runs as compiled, and `None` says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Program, Residency, Value
from ..ir.sides import BOTH, node_sides

PAIR_PREFIX = "pair:"
_PRODUCTS = ("compact_typed_matmul", "compact_indexed_matmul")
_TYPED_AGGREGATES = ("typed_aggregate", "typed_aggregate_rooted", "typed_aggregate_tn")
_NODE_TYPE_INDICES = ("srctype", "dsttype", "ntype")


@dataclass(frozen=True)
class PairProduct:
    """A new input ``key``: each pair's row of input ``x`` times its relation's matrix of
    input ``w`` ([relations, in, out]: per-edge-type data, or a parameter table read
    through per-edge input ``index``, Graphiler's ``W[edges.data['type']]``, which the
    pair graph serves only when that index is the graph's own edge types)."""
    key: str
    x: str
    w: str
    shape: tuple[int, ...]           # a pair's row: unit dims, then the output width
    index: str | None = None


@dataclass(frozen=True)
class TypeLookup:
    """A new per-edge-type input ``key``: parameter table ``table`` read per edge through
    input ``index``, fed the table itself (the pair graph is run only where ``index`` is
    the graph's own edge types over the table's rows)."""
    key: str
    table: str
    index: str


@dataclass
class SourcePairRewrite:
    """The program to run on the pair graph and how to feed it."""
    program: Program
    products: tuple[PairProduct, ...]
    lifted: tuple[str, ...]          # source-side inputs fed their rows gathered onto the pairs
    lookups: tuple[TypeLookup, ...] = ()


def rewrite_for_source_pairs(program: Program) -> SourcePairRewrite | None:
    """The pair-graph form of optimized ``program``, or None where it does not apply."""
    compact = [v for v in program.values if v.op in _PRODUCTS]
    if not compact or any(v.attrs["side"] != "src" or _rows_of_input(v.inputs[0]) is None
                          or any(i.op != "input" for i in v.inputs[1:]) for v in compact):
        return None
    if any(_refused(v) for v in program.values):
        return None
    products: dict[tuple[str, ...], PairProduct] = {}
    lookups: dict[str, TypeLookup] = {}
    type_indices = {v.inputs[2].attrs["key"] for v in compact if len(v.inputs) > 2}
    new = Program()
    mapped: dict[int, Value] = {}
    for v in program.values:
        if v.op == "input":      # one read by nothing else now is dropped when the program is optimized
            mapped[v.id] = new.input(v.attrs["key"], v.residency, v.shape, v.dtype, v.source)
        elif _type_lookup(v, type_indices):
            table, index = (i.attrs["key"] for i in v.inputs)
            lookup = lookups.setdefault(table, TypeLookup(f"{table}[{index}]", table, index))
            typed = new.inputs.get(lookup.key) or new.input(lookup.key, Residency.EDGE_TYPE, v.inputs[0].shape[1:],
                                                            v.dtype, v.source)
            mapped[v.id] = new.add("broadcast", typed, source=v.source, by="etype")
        elif v.op in _PRODUCTS:
            x = _rows_of_input(v.inputs[0]).attrs["key"]
            w, *index = (i.attrs["key"] for i in v.inputs[1:])
            product = products.get((x, w, *index))
            if product is None:
                key = f"{PAIR_PREFIX}{x}@{w}" + "".join(f"[{i}]" for i in index)
                product = products[(x, w, *index)] = PairProduct(key, x, w, v.shape, *index)
                table = new.input(product.key, Residency.NODE, v.shape, v.dtype, v.source)
            else:
                table = new.inputs[product.key]
            mapped[v.id] = new.add("broadcast", table, source=v.source, by="src")
        else:
            mapped[v.id] = new.add(v.op, *[mapped[i.id] for i in v.inputs], source=v.source, **v.attrs)
    for key, v in program.outputs.items():
        new.output(key, mapped[v.id])
    sides = node_sides(new)
    if any(side == BOTH for side in sides.values()) or any(sides.get(v.id) == "src" for v in new.outputs.values()):
        return None
    lifted = tuple(k for k, v in new.inputs.items()
                   if not k.startswith(PAIR_PREFIX) and sides.get(v.id) == "src")
    return SourcePairRewrite(new, tuple(products.values()), lifted, tuple(lookups.values()))


def _type_lookup(v: Value, type_indices: set[str]) -> bool:
    """``table[index]`` per edge, ``table`` a parameter input and ``index`` an input that
    some product reads as the edge types (so the pair graph runs only where it is)."""
    if v.op != "index_rows" or v.residency is not Residency.EDGE:
        return False
    table, index = v.inputs
    return (table.op == "input" and table.residency is Residency.SHARED and len(table.shape) >= 1
            and index.op == "input" and index.attrs["key"] in type_indices and index.shape == ())


def _rows_of_input(x: Value) -> Value | None:
    """The input whose rows ``x`` is, with at most unit dims put in front of its width by
    reshapes (a UDF's ``unsqueeze(1)`` before ``bmm``), else None."""
    shape = x.shape
    while x.op == "reshape":
        x = x.inputs[0]
    if x.op != "input" or len(x.shape) != 1 or any(d != 1 for d in shape[:-1]) or shape[-1:] != x.shape:
        return None
    return x


def _refused(v: Value) -> bool:
    """An op whose meaning changes when the sources are pairs."""
    by = v.attrs.get("by")
    return ((v.op in ("reduce", "degree") + _TYPED_AGGREGATES and by == "src")
            or by in _NODE_TYPE_INDICES
            or (v.op in _PRODUCTS and v.attrs.get("side") != "src"))

