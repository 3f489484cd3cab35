"""What cannot be compiled fails loudly, naming the construct and the user's line."""
from __future__ import annotations

import inspect

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


def test_missing_feature_key():
    @gnnfuse.vertex
    def f(v):
        return sum([u.hidden for u in v.innbs])
    with pytest.raises(CompileError, match="vertex feature 'hidden' does not exist; v_feature has \\['h'\\]"):
        f(graph(), {"h": torch.randn(3, 2)})

    with pytest.raises(CompileError, match=r"edges.src\['x'\] does not exist"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["x"]},
                                lambda n: {"o": torch.sum(n.mailbox["m"], dim=1)}, ndata={"h": torch.randn(3, 2)})


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
        return [u.h for u in v.innbs][0]
    with pytest.raises(CompileError, match="must return per-vertex values.*SRC"):
        f(graph(), {"h": torch.randn(3, 2)})


def test_reduce_fn_must_reduce_the_mailbox():
    with pytest.raises(CompileError, match="reduce_fn output 'o' is SRC data"):
        gnnfuse.message_passing(graph(), lambda e: {"m": e.src["h"]}, lambda n: {"o": n.mailbox["m"] * 2},
                                ndata={"h": torch.randn(3, 2)})


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
