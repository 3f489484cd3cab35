"""What cannot be compiled fails loudly, naming the construct and the user's line."""
from __future__ import annotations

import inspect
import operator

import re

import pytest
import torch

import gnnfuse
from gnnfuse import CompileError

GRAPH_ARGS = (torch.tensor([0, 1, 2, 2]), torch.tensor([1, 2, 0, 1]))


def graph():
    return gnnfuse.Graph(*GRAPH_ARGS, num_nodes=3)


def line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_python_if_on_a_symbolic_value():
    @gnnfuse.vertex
    def f(v):
        total = sum([u.h for u in v.innbs])
        if total > 0:
            return total
        return -total
    with pytest.raises(CompileError, match="control flow") as info:
        f(graph(), {"h": torch.randn(3, 2)})
    assert f":{line_of(f.fn, 'if total > 0')}:" in str(info.value)


def test_torch_function_without_registry_entry():
    @gnnfuse.vertex
    def f(v):
        return sum([torch.sin(u.h) for u in v.innbs])
    with pytest.raises(CompileError, match="torch function sin has no gnnfuse op") as info:
        f(graph(), {"h": torch.randn(3, 2)})
    assert f":{line_of(f.fn, 'torch.sin')}:" in str(info.value)


@pytest.mark.parametrize("expression, construct", [("u.h.ndim", "tensor attribute .ndim has"),
                                                     ("u.h.requires_grad", "tensor attribute .requires_grad has"),
                                                     ("u.h.cumsum(0)", "tensor method .cumsum() has"),
                                                     ("u.h.no_such_name", "a tensor has no attribute .no_such_name")])
def test_tensor_attributes_without_registry_entry_are_named_as_attributes(expression, construct):
    """A property (``.ndim``) was called a method, ``.ndim()``, which the UDF never wrote."""
    def message(u):
        return eval(expression, {"u": u}) * u.h
    f = gnnfuse.vertex(lambda v: sum([message(u) for u in v.innbs]))
    with pytest.raises(CompileError, match=re.escape(construct)):
        f(graph(), {"h": torch.randn(3, 2)})


def test_missing_feature_key():
    @gnnfuse.vertex
    def f(v):
        return sum([u.hidden for u in v.innbs])
    with pytest.raises(CompileError, match="vertex feature 'hidden' does not exist; v_feature has \\['h'\\]"):
        f(graph(), {"h": torch.randn(3, 2)})

    with pytest.raises(CompileError, match=r"edges.src\['x'\] does not exist"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["x"]},
                                lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": torch.randn(3, 2)})


def test_a_feature_named_type_is_refused_by_the_vertex_front_end():
    """``type`` names the per-type rows (``v.type.W``), so a feature of that name could not
    be read: ``v.type * 2`` failed on an internal class and ``u.type`` as "does not depend
    on the neighbour"."""
    h = torch.randn(3, 2)
    with pytest.raises(ValueError, match="v_feature has a feature named 'type'"):
        gnnfuse.vertex(lambda v: v.type * 2)(graph(), {"type": h})
    with pytest.raises(ValueError, match="e_feature has a feature named 'type'"):
        gnnfuse.vertex(lambda v: sum([e.type for e in v.inedges]))(graph(), {"h": h}, {"type": torch.randn(4, 2)})


def test_shape_mismatch_names_op_and_line():
    w = torch.randn(5, 4)

    @gnnfuse.vertex
    def f(v):
        return sum([u.h @ w for u in v.innbs])
    with pytest.raises(CompileError, match="op 'matmul' cannot take operands") as info:
        f(graph(), {"h": torch.randn(3, 2)})
    assert f":{line_of(f.fn, 'u.h @ w')}:" in str(info.value)


def test_vertex_function_must_aggregate():
    @gnnfuse.vertex
    def f(v):
        return operator.itemgetter(0)(v.innbs).h      # a spelling the syntax check does not see
    with pytest.raises(CompileError, match="must return per-vertex values.*SRC"):
        f(graph(), {"h": torch.randn(3, 2)})


def test_a_neighbour_value_read_after_its_loop_is_refused():
    """Eager code reads the last neighbour's ``h`` after the loop; the trace held a per-edge value."""
    @gnnfuse.vertex
    def f(v):
        for u in v.innbs:
            h = u.h
        return h
    with pytest.raises(CompileError, match="read after it") as info:
        f(graph(), {"h": torch.randn(3, 2)})
    assert f":{line_of(f.fn, 'return h')}:" in str(info.value)


def test_reduce_fn_must_reduce_the_mailbox():
    with pytest.raises(CompileError, match="reduce_fn output 'o' is SRC data"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, lambda n: {"o": n.mailbox["m"] * 2},
                                ndata={"h": torch.randn(3, 2)})


def test_a_udf_returning_an_empty_dict_is_named():
    """A reduce_fn (or update_fn) returning ``{}`` failed verification as "program has
    no outputs", naming neither the function nor its line."""
    def reduce(nodes):
        return {}
    with pytest.raises(CompileError, match="reduce_fn returned an empty dict") as info:
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, reduce, ndata={"h": torch.ones(3, 2)})
    assert str(line_of(reduce, "def reduce")) in str(info.value)


def test_reduction_over_the_edge_rows_in_message_fn():
    with pytest.raises(CompileError, match=r"dim 0 is the row axis \(one row per edge\)"):
        gnnfuse.message_passing(graph(), lambda e: {"m": torch.sum(e.src["h"], dim=0)},
                                lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": torch.randn(3, 2)})


def test_wrong_input_shape_at_run_time():
    @gnnfuse.vertex
    def f(v):
        return sum([u.h for u in v.innbs])
    with pytest.raises(ValueError, match="input 'h' \\(NODE\\) should have shape \\[3, 2\\], got \\[4, 2\\]"):
        f(graph(), {"h": torch.randn(4, 2)})


def test_sparse_input_is_rejected_with_a_clear_error():
    @gnnfuse.vertex
    def f(v):
        return sum([u.h for u in v.innbs])
    with pytest.raises(ValueError, match="input 'h' is a torch.sparse_coo tensor; compiled programs take dense"):
        f(graph(), {"h": torch.eye(3, 2).to_sparse()})


# --- issue #11 §3: every reachable error names the construct and the line ----------------
def error_line(info) -> str:
    return str(info.value).splitlines()[-1]


def test_argmax_indices_of_a_mailbox_reduction():
    def reduce(nodes):
        return {"o": torch.max(nodes.mailbox["m"], dim=1).indices}

    def reduce_indexed(nodes):
        return {"o": torch.max(nodes.mailbox["m"], dim=1)[1]}
    for fn, text in ((reduce, ".indices"), (reduce_indexed, "dim=1)[1]")):
        with pytest.raises(CompileError, match=r"indices of torch.max/min .* cannot be compiled") as info:
            gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, fn, ndata={"h": torch.randn(3, 2)})
        assert f":{line_of(fn, text)}:" in error_line(info) and text in error_line(info)


def test_feature_tables_must_be_dicts_of_tensors():
    h = torch.randn(3, 2)
    with pytest.raises(TypeError, match=r"ndata must be a dict of feature name -> tensor .* got Tensor"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]},
                                lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata=h)
    with pytest.raises(TypeError, match=r"edata must map str names to tensors; edata\['w'\] is list"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]},
                                lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": h}, edata={"w": [1.0]})
    # message passing checks a plain node table inline too (message._run); each other case,
    # a falsy table that is no dict included, still reaches `check_tables`
    attention = gnnfuse.frontend.UpdateAll(lambda e: {"m": e.src["h"]}, lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)})
    with pytest.raises(TypeError, match=r"ndata must map str names to tensors; ndata\['w'\] is list"):
        attention(graph(), ndata={"h": h, "w": [1.0]})
    with pytest.raises(TypeError, match=r"ndata must map str names to tensors; ndata\[0\] is Tensor"):
        attention(graph(), ndata={"h": h, 0: h})
    with pytest.raises(TypeError, match=r"edata must be a dict of feature name -> tensor .* got list"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]},
                                lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": h}, edata=[])
    torch.testing.assert_close(attention(graph(), ndata={"h": h})["o"],
                               gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]},
                                                       lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)},
                                                       ndata={"h": h}, edata={})["o"])

    @gnnfuse.vertex
    def f(v):
        return sum([u.h for u in v.innbs])
    with pytest.raises(TypeError, match=r"v_feature must be a dict of feature name -> tensor .* got Tensor"):
        f(graph(), h)
    # a vertex function checks a plain node table inline (vertex._run); each other case
    # still reaches `check_tables`, which names it
    with pytest.raises(TypeError, match=r"v_feature must map str names to tensors; v_feature\['w'\] is list"):
        f(graph(), {"h": h, "w": [1.0]})
    with pytest.raises(TypeError, match=r"v_feature must map str names to tensors; v_feature\[0\] is Tensor"):
        f(graph(), {"h": h, 0: h})
    with pytest.raises(TypeError, match=r"e_feature must map str names to tensors; e_feature\['w'\] is float"):
        f(graph(), {"h": h}, {"w": 1.0})


def test_udf_output_that_is_not_traced_names_the_key_and_what_it_holds():
    """Checked after the UDF returned, so the error names the UDF's definition line."""
    def reduce(nodes):
        return {"o": torch.sum(nodes.mailbox["m"], dim=1), "bias": torch.zeros(3, 2)}

    def message(edges):
        return {"m": edges.src["h"], "k": 2.0}

    def reduce_list(nodes):
        return [nodes.mailbox["m"]]

    def message_h(edges):
        return {"m": edges.src["h"]}
    cases = ((message, reduce, "message_fn output 'k' is a float", "def message"),
             (message_h, reduce, "reduce_fn output 'bias' is a tensor not computed from its edges/nodes argument",
              "def reduce(nodes)"),
             (message_h, reduce_list, "reduce_fn must return a dict of feature name -> tensor, got list",
              "def reduce_list"))
    for message_fn, reduce_fn, expected, text in cases:
        with pytest.raises(CompileError) as info:
            gnnfuse.message_passing(graph(), message_fn, reduce_fn, ndata={"h": torch.randn(3, 2)})
        assert expected in str(info.value) and text in error_line(info)


def _helper_that_fails(x):
    return torch.sin(x)


def test_error_inside_a_helper_names_the_helpers_line():
    @gnnfuse.vertex
    def f(v):
        return sum([_helper_that_fails(u.h) for u in v.innbs])
    with pytest.raises(CompileError, match="torch function sin has no gnnfuse op") as info:
        f(graph(), {"h": torch.randn(3, 2)})
    assert f":{line_of(_helper_that_fails, 'torch.sin')}: return torch.sin(x)" in error_line(info)

    def reduce(nodes):
        return {"o": _helper_that_fails(torch.sum(nodes.mailbox["m"], dim=1))}
    with pytest.raises(CompileError, match="torch function sin") as info:
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, reduce, ndata={"h": torch.randn(3, 2)})
    assert f":{line_of(_helper_that_fails, 'torch.sin')}:" in error_line(info)


def test_an_input_edited_before_backward_is_named_as_an_input():
    """The backward recomputes ``relu(w)`` from the saved input ``w``; an edit of ``w``
    between forward and backward (an optimizer step) raised "an output of the gnnfuse
    program was modified in place", naming an edit the user never made."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)
    out = gnnfuse.message_passing(graph(), lambda edges: {"m": torch.relu(edges.data["w"]) * edges.src["x"]},
                                  lambda nodes: {"h": nodes.mailbox["m"].sum(1)}, ndata={"x": x}, edata={"w": w})
    with torch.no_grad():
        w.add_(1.0)
    with pytest.raises(RuntimeError, match=r"the gnnfuse program on \(e\.w, x\) reads was modified in place after "
                                           r"the call: one of its inputs") as caught:
        out["h"].sum().backward()
    assert "an output of" not in str(caught.value)
