"""Front-end gaps left after issue #11's merges: values whose trace-time shape or count
differs from DGL's must compile to DGL's meaning or be rejected at the user's line.

Each construct runs against DGL's semantics written out in plain torch (mailboxes as each
vertex's in-edges in edge-id order, zero-in-degree vertices skipped and zero-filled), on
outputs and gradients in float64, on the reference backend and the Triton kernels.

1. ``nodes.data[k].unsqueeze(1)`` in a reduce UDF is [N, 1, F]: its size-1 neighbour axis
   reduces to itself, and meeting a mailbox value it broadcasts over the in-edges.
2. ``x.shape[0]`` (edges or vertices) is only a reshape's first size, never the number 1.
3. ``len`` (and sum/max/min) in a helper a vertex function calls count per vertex.
4. ``keepdims=`` is ``keepdim=``; torch.amax/amin return a tensor.
5. Python's ``max(a, b)`` on traced values is an error suggesting torch.maximum.
6. ``nodes.mailbox[k][:, i]`` is each vertex's i-th message; slices of that axis are errors.
7. On a raw edge_index the vertex count is the node table's row count, as under
   ``torch.compile``: a last vertex without edges is kept, not a shape error.
"""
from __future__ import annotations

import inspect
import re

import pytest
import torch

import gnnfuse
from gnnfuse import CompileError
from gnnfuse.frontend import UpdateAll

DOUBLE = torch.float64
SRC = torch.tensor([0, 2, 2, 4, 1, 0, 3])
DST = torch.tensor([1, 1, 1, 2, 0, 4, 1])
N = 5   # in-degrees 1, 4, 1, 0, 1: a multi-edge into 1, vertex 3 without in-edges


def graph(device: str) -> gnnfuse.Graph:
    return gnnfuse.Graph(SRC, DST, N).to(device)


def features(device: str, width: int = 3, seed: int = 0) -> torch.Tensor:
    """Drawn on the CPU (one stream for every device), then moved: a leaf on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, width, dtype=DOUBLE, generator=gen).to(device).requires_grad_()


def in_edges(v: int, device) -> torch.Tensor:
    """The sources of vertex ``v``'s in-edges in edge-id order, as an index on ``device``."""
    return SRC[DST == v].to(device)


def mailbox(h: torch.Tensor) -> list[torch.Tensor]:
    """DGL's mailbox, per vertex: its in-edges' messages in edge-id order ([D_v, ...])."""
    return [h[in_edges(v, h.device)] for v in range(N)]


def per_vertex(fn, *tables: torch.Tensor) -> torch.Tensor:
    """DGL's update_all reduce: ``fn(v, *rows)`` on each vertex with in-edges, zeros elsewhere."""
    rows = [fn(v, *(t[v] for t in tables)) for v in range(N) if (DST == v).any()]
    device = rows[0].device
    out = torch.zeros((N,) + rows[0].shape, dtype=DOUBLE, device=device)
    return out.index_put((torch.unique(DST).to(device),), torch.stack(rows))


def check(out: torch.Tensor, oracle, leaves: list[torch.Tensor]) -> None:
    """Outputs and the gradients of every leaf, against the plain-torch ``oracle()``."""
    weight = torch.linspace(-1, 2, out.numel(), dtype=DOUBLE, device=out.device).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    expected = oracle()
    expected_grads = torch.autograd.grad((expected * weight).sum(), leaves)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def line_of(fn, text: str) -> str:
    lines, start = inspect.getsourcelines(fn)
    return f":{start + next(i for i, line in enumerate(lines) if text in line)}: "


def copy_src(edges):
    return {"m": edges.src["h"]}


# --- 1: a node value unsqueezed at dim 1 has a size-1 neighbour axis ------------------------
def test_sum_over_the_size_one_axis_of_unsqueezed_node_data_is_the_data(device):
    def reduce(nodes):
        return {"out": torch.sum(nodes.data["h"].unsqueeze(1), dim=1) + torch.sum(nodes.mailbox["m"], dim=1)}
    g, h = graph(device), features(device)
    out = gnnfuse.message_passing(g, copy_src, reduce, ndata={"h": h})["out"]
    check(out, lambda: per_vertex(lambda v, hv: hv + mailbox(h)[v].sum(0), h), [h])


def test_unsqueezed_node_data_has_size_one_at_dim_1(device):
    def reduce(nodes):
        x = nodes.data["h"].unsqueeze(1)
        return {"out": torch.sum(nodes.mailbox["m"], dim=1) * x.shape[1] + x.sum(1, keepdim=True).squeeze(1)}
    g, h = graph(device), features(device)
    out = gnnfuse.message_passing(g, copy_src, reduce, ndata={"h": h})["out"]
    check(out, lambda: per_vertex(lambda v, hv: mailbox(h)[v].sum(0) + hv, h), [h])


def test_unsqueezed_node_data_broadcasts_over_the_mailbox(device):
    """Once combined with the mailbox it is per edge: the reduction over dim 1 is real, and
    a keepdim reduction meeting the mailbox again (a stable softmax) lines up as [N, 1, F]."""
    def reduce(nodes):
        m = nodes.mailbox["m"]
        scores = m * nodes.data["h"].unsqueeze(1)
        shifted = scores - torch.max(scores, dim=1, keepdim=True)[0]
        return {"out": torch.sum(torch.exp(shifted) * m, dim=1) + torch.sum(scores, 1)}

    def oracle_row(v, hv):
        m = mailbox(h)[v]
        scores = m * hv.unsqueeze(0)
        shifted = scores - scores.max(0, keepdim=True)[0]
        return (shifted.exp() * m).sum(0) + scores.sum(0)
    g, h = graph(device), features(device)
    out = gnnfuse.message_passing(g, copy_src, reduce, ndata={"h": h})["out"]
    assert out.shape == (N, 3)
    check(out, lambda: per_vertex(oracle_row, h), [h])


def test_node_data_without_the_neighbour_axis_next_to_the_mailbox_is_rejected():
    """[N, F] + [N, D, F] broadcasts the vertex axis against the neighbour axis in DGL."""
    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"] + nodes.data["h"], dim=1)}
    with pytest.raises(CompileError, match="unsqueeze") as info:
        gnnfuse.message_passing(graph("cpu"), copy_src, reduce, ndata={"h": features("cpu")})
    assert line_of(reduce, "nodes.data") in str(info.value)


def test_a_negative_unsqueeze_among_the_graph_axes_is_named_as_such():
    """``x.unsqueeze(-3)`` of an [E, F] message is torch's [1, E, F], and
    ``m.unsqueeze(-4)`` of a [N, D, F] mailbox its [1, N, D, F]: valid dims that add an
    axis before the rows, which the error called "out of range" (only the positive
    spellings, unsqueeze(0), were named as graph axes)."""
    def message(edges):
        return {"m": edges.src["h"].unsqueeze(-3).sum(0)}

    def reduce(nodes):
        return {"out": nodes.mailbox["m"].unsqueeze(-4).sum(1)}
    sum_mailbox = lambda nodes: {"out": torch.sum(nodes.mailbox["m"], 1)}   # noqa: E731
    for (message_fn, reduce_fn), at, text, graph_dims in (((message, sum_mailbox), message, "unsqueeze(-3)", "dim 0"),
                                                          ((copy_src, reduce), reduce, "unsqueeze(-4)", "dims 0-1")):
        with pytest.raises(CompileError, match=rf"{re.escape(text)} adds an axis among the graph dims \({graph_dims}") \
                as info:
            gnnfuse.message_passing(graph("cpu"), message_fn, reduce_fn, ndata={"h": features("cpu")})
        assert line_of(at, text) in str(info.value)


# --- 2: the row axis' length (edges or vertices) is not a trace-time number ----------------
def test_row_count_kept_in_its_own_position_of_a_reshape(device):
    heads = 3

    def message(edges):
        m = edges.src["h"] * edges.dst["h"]
        return {"m": m.view(m.shape[0], heads, -1).sum(-1).reshape(m.size(0), heads, 1)}

    def reduce(nodes):
        m = nodes.mailbox["m"]
        return {"out": torch.sum(m.view(m.shape[0], m.shape[1], -1), dim=1)}
    g, h = graph(device), features(device, 6)

    def oracle():
        src, dst = SRC.to(h.device), DST.to(h.device)
        m = (h[src] * h[dst]).view(-1, heads, 2).sum(-1)
        return per_vertex(lambda v: m[dst == v].sum(0))
    out = gnnfuse.message_passing(g, message, reduce, ndata={"h": h})["out"]
    check(out, oracle, [h])


@pytest.mark.parametrize("use, text", [
    (lambda x: x * x.shape[0], "arithmetic"),
    (lambda x: x / x.size(0), "arithmetic"),
    (lambda x: x * int(x.shape[0]), "int"),
    (lambda x: sum(x for _ in range(x.size(0))), "range"),
    (lambda x: x.view(-1, x.shape[0]), "reshape"),
    (lambda x: x * torch.ones(x.shape[0], 1), "torch.ones"),     # torch's parser swallowed the error
    (lambda x: x + torch.zeros(x.size(0), x.shape[1]), "torch.zeros"),
])
def test_row_count_anywhere_else_is_rejected_at_its_line(use, text):
    def message(edges):
        return {"m": use(edges.src["h"])}
    with pytest.raises(CompileError, match=r"shape\[0\]") as info:
        gnnfuse.message_passing(graph("cpu"), message, lambda nodes: {"out": torch.sum(nodes.mailbox["m"], 1)},
                                ndata={"h": features("cpu")})
    assert "test_frontend_gaps.py:" in str(info.value) and "(lambda x:" in str(info.value)


def test_a_reshape_setting_a_graph_axis_to_1_is_rejected_at_its_line():
    """torch's ``x.reshape(1, -1)`` of an [E, F] value is one [1, E * F] row, and
    ``m.reshape(-1, 1, F)`` of a [N, D, F] mailbox is [N * D, 1, F]: the 1 was taken as
    "keep the graph axis", so ``x.reshape(1, -1).sum(-1, keepdim=True) * x`` scaled each
    edge by its own row's sum where torch scales it by the sum over all edges (a silently
    wrong output), and the mailbox's neighbour axis stayed in place."""
    def message(edges):
        h = edges.src["h"]
        return {"m": h.reshape(1, -1).sum(-1, keepdim=True) * h}

    def reduce(nodes):
        m = nodes.mailbox["m"]
        return {"out": m.reshape(-1, 1, 3).sum(1)}

    def two_inferred(edges):
        return {"m": edges.src["h"].reshape(-1, -1)}
    sum_mailbox = lambda nodes: {"out": torch.sum(nodes.mailbox["m"], 1)}   # noqa: E731
    for (message_fn, reduce_fn), at, text, match in (
            ((message, sum_mailbox), message, "h.reshape(1, -1)", "sets the row axis .* to 1"),
            ((copy_src, reduce), reduce, "m.reshape(-1, 1, 3)", "sets a neighbour axis .* to 1"),
            ((two_inferred, sum_mailbox), two_inferred, "reshape(-1, -1)", "only one dimension can be inferred")):
        with pytest.raises(CompileError, match=match) as info:
            gnnfuse.message_passing(graph("cpu"), message_fn, reduce_fn, ndata={"h": features("cpu")})
        assert line_of(at, text) in str(info.value)


def test_a_view_as_another_dtype_is_named_and_one_as_the_own_dtype_is_the_value():
    """``x.view(dtype)`` is torch's other view (the bytes read as another dtype), not a
    reshape: the dtype was taken for a size and refused as "reshape [torch.int64] must
    keep the leading graph dims as -1", and ``x.view(x.dtype)``, the value itself in
    torch, was refused the same way."""
    def reinterpreted(edges):
        return {"m": edges.src["h"].view(torch.int64)}

    def same(edges):
        return {"m": edges.src["h"].view(torch.float64) * 2}
    sum_mailbox = lambda nodes: {"out": torch.sum(nodes.mailbox["m"], 1)}   # noqa: E731
    with pytest.raises(CompileError, match=r"x.view\(torch.int64\) of a torch.float64 graph value reinterprets "
                                           r"its bytes") as info:
        gnnfuse.message_passing(graph("cpu"), reinterpreted, sum_mailbox, ndata={"h": features("cpu")})
    assert line_of(reinterpreted, "view(torch.int64)") in str(info.value)
    h = features("cpu")
    out = gnnfuse.message_passing(graph("cpu"), same, sum_mailbox, ndata={"h": h})["out"]
    check(out, lambda: torch.stack([2 * rows.sum(0) for rows in mailbox(h)]), [h])


# --- 3: len() of a neighbour list inside a helper the vertex function calls ---------------
def _mean_of(values):
    one = max(2, min(4, 3)) - len([0, 1]) + sum(i for i in range(1))   # builtins on other values
    return sum(values) / len(values) * one


def _count(neighbours):
    return len(neighbours)


def in_neighbour_mean(h: torch.Tensor) -> torch.Tensor:
    return per_vertex(lambda v: h[in_edges(v, h.device)].mean(0))


def test_len_in_a_helper_is_the_in_degree(device):
    @gnnfuse.vertex
    def mean(v):
        return _mean_of([u.h for u in v.innbs])

    @gnnfuse.vertex
    def mean_by_count(v):
        return sum([u.h for u in v.innbs]) / _count([u.h for u in v.innbs])

    @gnnfuse.vertex
    def mean_by_degree(v):
        return sum([u.h for u in v.innbs]) / _count(v.innbs)
    g, h = graph(device), features(device)
    for fn in (mean, mean_by_count, mean_by_degree):
        check(fn(g, {"h": h}), lambda: in_neighbour_mean(h), [h])


# --- 4: keepdims (numpy's spelling, as Graphiler's HGT writes it); amax/amin are tensors ---
def test_keepdims_alias_and_amax_amin_return_tensors(device):
    def reduce(nodes):
        m = nodes.mailbox["m"]
        kept = torch.sum(m, dim=1, keepdims=True) + m.mean(1, keepdims=True) * torch.amin(m, 1, keepdims=True)
        return {"out": kept.squeeze(1) + torch.amax(m, dim=1) - m.amin(dim=1)}

    def oracle_row(v):
        m = mailbox(h)[v]
        return m.sum(0) + m.mean(0) * m.amin(0) + m.amax(0) - m.amin(0)
    g, h = graph(device), features(device)
    out = gnnfuse.message_passing(g, copy_src, reduce, ndata={"h": h})["out"]
    check(out, lambda: per_vertex(oracle_row), [h])


# --- 5: Python's max/min of two tensors compares them, which a traced value cannot ---------
def test_builtin_max_of_two_tensors_is_rejected_with_the_torch_function():
    @gnnfuse.vertex
    def pairwise_max(v):
        return sum([max(u.h, v.h) for u in v.innbs])

    @gnnfuse.vertex
    def pairwise_min(v):
        return sum([min(u.h, v.h, key=None) for u in v.innbs])
    for fn, torch_name in ((pairwise_max, "torch.maximum"), (pairwise_min, "torch.minimum")):
        with pytest.raises(CompileError, match=torch_name) as info:
            fn(graph("cpu"), {"h": features("cpu")})
        assert line_of(fn.fn, "for u in v.innbs") in str(info.value)


def test_builtin_max_of_numbers_in_a_vertex_function(device):
    @gnnfuse.vertex
    def scaled_max(v):
        return max([u.h for u in v.innbs]) * max(2, min(4, 3)) + min(1.0, 0.5) * v.h
    g, h = graph(device), features(device)
    check(scaled_max(g, {"h": h}), lambda: per_vertex(lambda v: h[in_edges(v, h.device)].amax(0) * 3) + 0.5 * h, [h])


def test_builtin_max_of_an_in_degree_and_numbers_compares_per_vertex(device):
    """``sum(...) / max(len(v.inedges), 1)`` compares two Python numbers per vertex in
    eager code; it was refused as a comparison of tensors."""
    @gnnfuse.vertex
    def clamped_mean(v):
        return sum([u.h for u in v.innbs]) / max(len(v.inedges), 1) + min(len(v.innbs), 2, 3.5) * v.h

    def oracle(v):
        ins = in_edges(v, h.device)
        return h[ins].sum(0) / max(len(ins), 1) + min(len(ins), 2, 3.5) * h[v]
    g, h = graph(device), features(device)
    check(clamped_mean(g, {"h": h}), lambda: per_vertex(oracle), [h])


# --- 6: mailbox[k][:, i], the i-th message of each vertex (in-edges in edge-id order) -----
def test_mailbox_message_at_a_constant_position(device):
    """Vertex 1 has four in-edges (ids 0, 1, 2, 6: a multi-edge), the others one or none:
    positions 0 and -1 are defined on every vertex with in-edges."""
    def reduce(nodes):
        m = nodes.mailbox["m"]
        return {"out": m[:, 0] * 2 - m[:, -1, 1:] .sum(-1, keepdim=True) + torch.sum(m, dim=1)}

    def oracle_row(v):
        m = mailbox(h * w)[v]
        return m[0] * 2 - m[-1, 1:].sum(-1, keepdim=True) + m.sum(0)
    g, h = graph(device), features(device)
    w = torch.linspace(0.5, 2, N, dtype=DOUBLE).unsqueeze(1).to(device).requires_grad_()

    def message(edges):
        return {"m": edges.src["h"] * edges.src["w"]}
    out = gnnfuse.message_passing(g, message, reduce, ndata={"h": h, "w": w})["out"]
    check(out, lambda: per_vertex(oracle_row), [h, w])


def test_mailbox_position_beyond_a_vertex_in_degree_raises():
    """DGL raises IndexError on the degree bucket whose mailbox is too short."""
    def reduce(nodes):
        return {"out": nodes.mailbox["m"][:, 1]}
    with pytest.raises(ValueError, match=r"\[:, 1\].*in-degree 1"):
        gnnfuse.message_passing(graph("cpu"), copy_src, reduce, ndata={"h": features("cpu")})
    hub = gnnfuse.Graph(torch.tensor([0, 2, 4]), torch.tensor([1, 1, 1]), 5)   # degree 3 or 0
    out = gnnfuse.message_passing(hub, copy_src, lambda nodes: {"out": nodes.mailbox["m"][:, -3]},
                                  ndata={"h": features("cpu")})["out"]
    torch.testing.assert_close(out[1], features("cpu")[0].detach())
    assert not out[[0, 2, 3, 4]].any()


def test_mailbox_slice_over_the_neighbour_axis_is_rejected_at_its_line():
    def reduce(nodes):
        first = nodes.mailbox["m"][:, 1:3]
        return {"out": torch.sum(first, dim=1)}
    with pytest.raises(CompileError, match="neighbour axis") as info:
        gnnfuse.message_passing(graph("cpu"), copy_src, reduce, ndata={"h": features("cpu")})
    assert line_of(reduce, "first = ") in str(info.value)


def test_an_index_naming_fewer_dims_than_the_graph_axes_takes_them_whole(device):
    """``m[:]`` and ``m[()]`` of a [N, D, F] mailbox, and ``x[()]`` of an [E, F] message,
    are the value itself in torch. The dims no index names were read off the value's shape,
    graph axes included, and their symbolic sizes compared as feature sizes: refused with
    "comparing graph values (<, >, ==, ...)" or "x.shape[0] ... is not known", neither of
    which the line wrote."""
    def message(edges):
        return {"m": (edges.src["h"] * edges.src["w"])[()]}

    def reduce(nodes):
        m = nodes.mailbox["m"]
        return {"out": m[:][:, 0] + torch.sum(m[()], dim=1) * 2}
    g, h = graph(device), features(device)
    w = torch.linspace(0.5, 2, N, dtype=DOUBLE).unsqueeze(1).to(device).requires_grad_()
    out = gnnfuse.message_passing(g, message, reduce, ndata={"h": h, "w": w})["out"]
    check(out, lambda: per_vertex(lambda v: mailbox(h * w)[v][0] + mailbox(h * w)[v].sum(0) * 2), [h, w])


def test_gradcheck_mailbox_position():
    def reduce(nodes):
        return {"out": nodes.mailbox["m"][:, -1] * nodes.mailbox["m"][:, 0]}
    g = graph("cpu")
    torch.autograd.gradcheck(lambda h: gnnfuse.message_passing(g, copy_src, reduce, ndata={"h": h})["out"],
                             (features("cpu", 2),))


def test_concurrent_traces_leave_the_builtins_as_they_were():
    """Tracing swaps ``sum``/``max``/``min``/``len`` in ``builtins`` for the trace; two
    threads tracing at once once interleaved their swaps and left one trace's wrappers
    installed for good. A captured tensor makes every call trace."""
    import builtins
    import threading

    original = {name: getattr(builtins, name) for name in ("sum", "max", "min", "len")}
    g = gnnfuse.Graph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]))
    scale = torch.ones(2)

    def work():
        @gnnfuse.vertex
        def mean(v):
            xs = [u.h * scale for u in v.innbs]
            return sum(xs) / len(xs)
        for _ in range(100):
            mean(g, {"h": torch.randn(3, 2)})

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(getattr(builtins, name) is fn for name, fn in original.items())


@gnnfuse.vertex
def neighbour_sum_plus_self(v):
    return sum([u.h for u in v.innbs]) + v.h


def test_a_raw_edge_index_counts_the_node_table_rows_as_a_compiled_call_does():
    """7. Vertex 3 has no edges, so the largest id gives 3 vertices; the eager call raised
    "input 'h' should have shape [3, 2]" where the torch.compile path (call_compiled) ran
    on the table's 4 rows. Every front end now reads the count from the node table."""
    def reduce(nodes):
        return {"out": torch.sum(nodes.mailbox["m"], dim=1)}
    edge_index, h = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.randn(4, 2, dtype=DOUBLE)
    g = gnnfuse.Graph(edge_index[0], edge_index[1], 4)
    torch.testing.assert_close(neighbour_sum_plus_self(edge_index, {"h": h}), neighbour_sum_plus_self(g, {"h": h}))
    for call in (lambda graph: gnnfuse.message_passing(graph, copy_src, reduce, ndata={"h": h}),
                 lambda graph: UpdateAll(copy_src, reduce)(graph, ndata={"h": h}),
                 lambda graph: gnnfuse.apply_edges(graph, copy_src, ndata={"h": h})):
        torch.testing.assert_close(call(edge_index), call(g))


def _summed(nodes):
    return {"h": nodes.mailbox["m"].sum(1)}


@pytest.mark.parametrize("message, reduce, text, instead", [
    (lambda edges: {"m": edges.src["h"] * edges.edges()[2].unsqueeze(-1)}, _summed, "edges.edges()",
     "edata={'eid': torch.arange(E)}"),
    (lambda edges: {"m": edges.src["h"] * edges.batch_size()}, _summed, "edges.batch_size()", "all edges at once"),
    (lambda edges: {"m": edges.src["h"]}, lambda nodes: {"h": nodes.mailbox["m"].sum(1) / nodes.batch_size()},
     "nodes.batch_size()", "all vertices at once"),
    (lambda edges: {"m": edges.src["h"]}, lambda nodes: {"h": nodes.mailbox["m"].sum(1) * nodes.nodes()[:, None]},
     "nodes.nodes()", "nodes.data['id']"),
    (lambda edges: {"m": edges.src["h"] * (edges.canonical_etype is None)}, _summed, "edges.canonical_etype",
     "etype_data"),
    (lambda edges: {"m": edges.src["h"] / len(edges)}, _summed, "len(edges)", "all edges at once"),
    (lambda edges: {"m": edges.src["h"]}, lambda nodes: {"h": nodes.mailbox["m"].sum(1) / len(nodes)},
     "len(nodes)", "all vertices at once"),
])
def test_dgl_batch_members_a_compiled_udf_lacks_are_refused_at_their_line(message, reduce, text, instead):
    """DGL's EdgeBatch/NodeBatch methods were a bare AttributeError on '_Edges' naming no
    line, and ``hasattr`` called them missing where DGL has them."""
    with pytest.raises(CompileError) as caught:
        gnnfuse.message_passing(graph("cpu"), message, reduce, ndata={"h": features("cpu")})
    assert text in caught.value.message and instead in caught.value.message
    assert "test_frontend_gaps.py" in caught.value.source


def test_ids_passed_as_data_stand_in_for_dgl_batch_methods_and_other_names_stay_missing():
    """What the refusal advises gives DGL's numbers; a name DGL lacks too is an
    AttributeError (``hasattr`` False), as before."""
    h, ids, eids = features("cpu").detach(), torch.arange(N), torch.arange(len(SRC))

    def message(edges):
        scale = 2.0 if hasattr(edges, "no_such_member") else 1.0
        return {"m": scale * edges.src["h"] * edges.data["eid"][:, None] + (edges.src["id"] - edges.dst["id"])[:, None]}
    out = gnnfuse.message_passing(graph("cpu"), message, lambda nodes: {"h": nodes.mailbox["m"].sum(1)
                                                                        * nodes.data["id"][:, None]},
                                  ndata={"h": h, "id": ids}, edata={"eid": eids})["h"]
    rows = h[SRC] * eids[:, None] + (SRC - DST)[:, None]
    torch.testing.assert_close(out, torch.zeros(N, 3, dtype=DOUBLE).index_add(0, DST, rows) * ids[:, None])
    with pytest.raises(AttributeError, match=r"edges.no_such_member does not exist \(a compiled UDF's edges"):
        gnnfuse.message_passing(graph("cpu"), lambda edges: {"m": edges.no_such_member}, _summed, ndata={"h": h})


def test_udf_frames_are_dicts():
    """DGL hands a UDF its frames as dicts: ``edges.src.items()``, ``len(edges.src)``,
    ``dict(edges.src)`` and ``edges.data.items()`` (a written key included) work as on
    them. They raised a bare AttributeError or TypeError, and ``for k in edges.src``
    probed ``edges.src[0]`` ("does not exist")."""
    g = gnnfuse.Graph(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]))
    a, b, w = torch.randn(3, 2), torch.randn(3, 2), torch.randn(4, 1)

    def edge_fn(edges):
        edges.data["e"] = edges.data["w"] * 2.0
        out = {"s_" + k: v * len(edges.src) for k, v in edges.src.items()}
        out.update({"c_" + k: v for k, v in dict(edges.dst).items()})
        out.update({"d_" + k: edges.data[k] + 1.0 for k in edges.data.keys()})
        return out | {"total": sum(edges.src.values())}
    out = gnnfuse.apply_edges(g, edge_fn, ndata={"a": a, "b": b}, edata={"w": w})
    s, d = g.src, g.dst
    expected = {"s_a": a[s] * 2, "s_b": b[s] * 2, "c_a": a[d], "c_b": b[d], "d_w": w + 1.0,
                "d_e": w * 2.0 + 1.0, "total": a[s] + b[s], "e": w * 2.0}
    torch.testing.assert_close(out, expected)
