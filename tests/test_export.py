"""torch.export captures the layers torch.compile captures, and names what it cannot.

Export ran gnnfuse's code on FakeTensors, which the compile path did not take for an
``edge_index`` ("under torch.compile a graph given as FakeTensor cannot be traced"); a
call with no compile path ended in "'GraphRef' object has no attribute 'num_edges'", and a
Graph built in the exported code in "Could not extract specialized integer from
data-dependent expression u0"."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import gnnfuse
import gnnfuse.nn as ours
from gnnfuse.ir import CompileError
from layer_check import assert_same_values

EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])
OTHER_EDGES = torch.tensor([[5, 5, 2, 0, 4, 1, 1], [1, 2, 2, 4, 3, 0, 0]])     # same shape, other graph
LAYERS = {"gcn": lambda: ours.GCNConv(4, 3), "gat": lambda: ours.GATConv(4, 3, heads=2),
          "sage_list": lambda: ours.SAGEConv(4, 3, aggr=["mean", "max"]), "tag": lambda: ours.TAGConv(4, 3)}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("backend", ["reference", "triton"], indirect=True)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_an_exported_layer_runs_on_another_edge_index(name, backend, device):
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device, torch.float64)
    x, other_x = (torch.randn(6, 4, dtype=torch.float64, device=device) for _ in range(2))
    exported = torch.export.export(layer, (x, EDGE_INDEX.to(device)))
    other_edges = OTHER_EDGES.to(device)
    assert_same_values(exported.module()(other_x, other_edges), layer(other_x, other_edges), f"exported {name}")


def test_strict_export_and_a_udf_on_a_graph_built_outside():
    graph = gnnfuse.Graph.from_edge_index(EDGE_INDEX, 6)

    @gnnfuse.vertex
    def neighbour_sum(v):
        return sum([u.h for u in v.innbs])

    class OnGraph(torch.nn.Module):
        def forward(self, x):
            return neighbour_sum(graph, {"h": x})

    x = torch.randn(6, 4, dtype=torch.float64)
    exported = torch.export.export(OnGraph(), (x,), strict=True)
    assert_same_values(exported.module()(x * 2), OnGraph()(x * 2), "strictly exported UDF")


@pytest.mark.parametrize("draws", [False, True])
def test_non_strict_export_of_a_vertex_function_reads_the_random_states(draws):
    """Non-strict export (the default) runs the trace under its tracing mode, where the
    random generators' states could not be read: each read gave a new marker, and every
    vertex function -- GCNConv's too -- was refused as drawing a random number. A real
    draw is still refused."""
    graph = gnnfuse.Graph.from_edge_index(EDGE_INDEX, 6)

    @gnnfuse.vertex
    def neighbour_sum(v):
        return sum([u.h * 2.0 for u in v.innbs])

    @gnnfuse.vertex
    def noisy_sum(v):
        return sum([u.h * random.random() for u in v.innbs])

    class OnGraph(torch.nn.Module):
        def forward(self, x):
            return (noisy_sum if draws else neighbour_sum)(graph, {"h": x})

    x = torch.randn(6, 4, dtype=torch.float64)
    if draws:
        with pytest.raises(CompileError, match="random"):
            torch.export.export(OnGraph(), (x,))
        return
    exported = torch.export.export(OnGraph(), (x,))
    assert_same_values(exported.module()(x * 2), OnGraph()(x * 2), "exported UDF")


def test_a_call_without_a_compile_path_is_refused_by_name():
    class Weighted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ours.GCNConv(4, 3)

        def forward(self, x, edge_index, edge_weight):
            return self.conv(x, edge_index, edge_weight)

    with pytest.raises(CompileError, match="torch.export cannot capture GCNConv: edge_weight"):
        torch.export.export(Weighted(), (torch.randn(6, 4), EDGE_INDEX, torch.rand(7)))


def test_a_graph_built_in_exported_code_is_refused_by_name():
    class Builds(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ours.GCNConv(4, 3)

        def forward(self, x, edge_index):
            return self.conv(x, gnnfuse.Graph.from_edge_index(edge_index, 6))

    with pytest.raises(NotImplementedError, match="under torch.export: a gnnfuse Graph reads its ids' values"):
        torch.export.export(Builds(), (torch.randn(6, 4), EDGE_INDEX))


def test_a_typed_graph_layer_is_refused_by_name():
    class Typed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ours.RGCNConv(4, 3, 2)

        def forward(self, x, edge_index, edge_type):
            return self.conv(x, edge_index, edge_type)

    with pytest.raises(CompileError, match="torch.export cannot capture RGCNConv: a typed graph"):
        torch.export.export(Typed(), (torch.randn(6, 4), EDGE_INDEX, torch.zeros(7, dtype=torch.long)))


_SCALE = 2.0


def test_an_exported_udf_whose_global_changed_is_refused_with_a_fix_that_works():
    """The message told the user to call torch.compiler.reset(), which an exported program
    ignores: every later call raised it again."""
    global _SCALE
    graph = gnnfuse.Graph.from_edge_index(EDGE_INDEX, 6)

    @gnnfuse.vertex
    def scaled(v):
        return sum([u.h for u in v.innbs]) * _SCALE

    class OnGraph(torch.nn.Module):
        def forward(self, x):
            return scaled(graph, {"h": x})
    x = torch.randn(6, 4, dtype=torch.float64)
    exported = torch.export.export(OnGraph(), (x,))
    try:
        _SCALE = 9.0
        with pytest.raises(RuntimeError, match="exported program must be exported again"):
            exported.module()(x)
        again = torch.export.export(OnGraph(), (x,))
        assert_same_values(again.module()(x), OnGraph()(x), "exported again")
    finally:
        _SCALE = 2.0


_SAVE = """
import sys, torch, gnnfuse.nn as ours
torch.manual_seed(0)
layer = ours.GCNConv(4, 3)
x, edge_index = torch.randn(6, 4), torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])
torch.export.save(torch.export.export(layer, (x, edge_index)), sys.argv[1] + "/gcn.pt2")
torch.save((x, edge_index, layer(x, edge_index)), sys.argv[1] + "/io.pt")
"""
_LOAD = """
import sys, torch, gnnfuse.nn as ours
x, edge_index, expected = torch.load(sys.argv[1] + "/io.pt")
torch.compile(ours.GCNConv(4, 3, normalize=False), backend="eager")(x, edge_index)     # this process's first program
try:
    got = torch.export.load(sys.argv[1] + "/gcn.pt2").module()(x, edge_index)
except RuntimeError as error:
    assert "is not one this process has built" in str(error), error
else:
    raise AssertionError(f"ran another program: {(got - expected).abs().max().item()} off the export's output")
"""


def test_a_saved_export_loaded_in_another_process_refuses_that_process_programs(tmp_path):
    """Programs were named by their count in the process ("p0"): an exported GCNConv saved
    with torch.export.save and loaded in a process whose first program was a
    GCNConv(normalize=False)'s ran that one, 2.1 off the export's output (in a fresh process
    a KeyError 'p0'). The name now carries the program's digest, and a name this process
    has not built is refused by name."""
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    for script in (_SAVE, _LOAD):
        result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                                env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
