"""`gnnfuse.explain` and `gnnfuse explain`: units and plain ops listed, byte estimates that
follow the documented model on the graph's real N and E, DOT text, rendering, CLI."""
from __future__ import annotations

import importlib
import re
import warnings

import pytest
import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

import gnnfuse
from gnnfuse import frontend
from gnnfuse.cli import main
from gnnfuse.nn import GATConv
from oracle_check import device_for


@pytest.fixture(autouse=True)
def csr_schedule(monkeypatch):
    """The byte counts below are the CSR walk's; on graphs this small the cost rule would
    pick the edge-parallel schedule, which has its own (tested last)."""
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")


def _graph() -> gnnfuse.Graph:
    src = torch.tensor([0, 1, 2, 3, 4, 0, 2])
    dst = torch.tensor([1, 2, 3, 4, 0, 3, 0])
    return gnnfuse.Graph(src, dst, 5)


@gnnfuse.vertex
def _neighbour_sum(v):
    return sum([u.h * u.w for u in v.innbs])


def test_sum_lists_a_fused_unit_with_bytes_from_n_and_e():
    graph = _graph()
    h = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 1, dtype=torch.float64)
    report = gnnfuse.explain(_neighbour_sum, graph, {"h": h, "w": w})
    assert torch.allclose(report.result, _neighbour_sum(graph, {"h": h, "w": w}))
    [program] = report.programs
    assert program.call.wrt == ("h",) and program.backward is not None
    [unit] = [s for s in program.forward.steps if s.fused]
    n, e, idx = graph.num_nodes, graph.num_edges, torch.empty((), dtype=graph.index_dtype).element_size()
    # broadcast reordering makes h * w a per-vertex product, which the unit takes back
    # in: it gathers h and w per edge and multiplies in registers, reads rowptr and the
    # neighbour column, and writes one NODE[3] row per vertex; no other step runs
    assert [s for s in program.forward.steps if not s.fused] == []
    assert unit.traffic.reads == e * (3 + 1) * 8
    assert unit.traffic.index == ((n + 1) + e) * idx
    assert unit.traffic.writes == n * 3 * 8
    assert [v.op for v in unit.writes] == ["reduce"] and {v.op for v in unit.body} >= {"broadcast", "mul"}
    text = str(report)
    for expected in ("--- traced ---", "--- optimized ---", "forward plan", "backward plan",
                     "reduce[sum by dst]", "per edge (gathered by src)", f"N={n:,}", f"E={e:,}"):
        assert expected in text


def test_plain_ops_count_their_inputs_and_output_in_full():
    graph = _graph()
    h = torch.randn(5, 4, dtype=torch.float64)

    @gnnfuse.vertex
    def scaled(v):
        return sum([u.h for u in v.innbs]) * v.h

    report = gnnfuse.explain(scaled, graph, {"h": h})
    [mul] = [s for s in report.programs[0].forward.steps if not s.fused]
    assert mul.item.op == "mul" and mul.traffic == type(mul.traffic)(2 * 5 * 4 * 8, 0, 5 * 4 * 8)
    assert report.programs[0].backward is None and "backward: none" in str(report)


def test_gat_layer_units_dot_source_and_render(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", "0")   # the untiled plan: the scores are an edge unit's root
    graph = _graph()
    conv = GATConv(6, 2, heads=2).double()
    x = torch.randn(5, 6, dtype=torch.float64)
    report = gnnfuse.explain(conv, x, graph, source=True)
    [program] = report.programs
    assert program.call.graph.num_edges == graph.num_edges + graph.num_nodes   # GATConv adds self loops
    steps = program.forward.steps + program.backward.steps
    assert all(s.traffic.total > 0 for s in steps)
    units = [s for s in steps if s.fused]
    assert any(s.item.root.op == "reduce" for s in units) and any(s.item.root.residency.is_edge_rowed for s in units)
    assert all(s.source and "@triton.jit" in s.source or s.source == "(the kernel above)" for s in units)
    assert "tl.float64" in units[0].source
    dot = report.to_dot()
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    for op in ("stop_gradient", "broadcast", "reduce", "cluster_p1f_u0", "program 1 backward"):   # softmax, decomposed
        assert op in dot
    assert dot.count("{") == dot.count("}")
    png = report.render(tmp_path / "gat.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dot_draws_every_fused_unit_with_the_values_it_recomputes():
    """GAT's three forward units each recompute the scores (broadcasts, add, leaky_relu) in
    registers; to_dot declared one node per value in each unit's cluster, and Graphviz
    draws a node declared in several clusters in one of them, so two of the units were
    drawn without the values they compute. Each unit now has its own copy, fed by its
    own edges."""
    report = gnnfuse.explain(GATConv(6, 2, heads=2).double(), torch.randn(5, 6, dtype=torch.float64), _graph())
    dot = report.to_dot()
    declared = re.findall(r"^\s*(\w+) \[label", dot, re.M)
    assert len(declared) == len(set(declared))
    edges = re.findall(r"^\s*(\w+) -> (\w+);", dot, re.M)
    assert {n for edge in edges for n in edge} <= set(declared)
    units = [s for s in report.programs[0].forward.steps if s.fused]
    recomputed = {v.id for v in units[0].body} & {v.id for v in units[1].body}
    assert recomputed
    for k, unit in enumerate(units):
        cluster = dot.split(f"subgraph cluster_p1f_u{k} {{")[1].split("}")[0]
        drawn = re.findall(r"^\s*(\w+) \[label", cluster, re.M)
        assert len(drawn) == len(unit.body) + len(unit.writes)
        assert all(f"_u{k}_{i} [" in cluster for i in recomputed if i in {v.id for v in unit.body})
        # a recomputed value's copy is fed inside its unit: every edge into it starts in the unit or outside all
        for name in drawn:
            assert all(src in drawn or "_u" not in src for src, dst in edges if dst == name)


def test_matplotlib_drawing_shows_every_fused_unit_with_the_values_it_recomputes(tmp_path, monkeypatch):
    """Without Graphviz, render() draws with networkx and matplotlib, one colour per fused
    unit. It drew each value once, coloured by the last unit holding it: GAT's first two
    forward units were drawn without the scores they recompute. Each unit now has its own
    coloured node of such a value, fed by its own edges, as in to_dot (`_unit_nodes`)."""
    networkx = pytest.importorskip("networkx")
    pytest.importorskip("matplotlib")
    explain_module = importlib.import_module("gnnfuse.runtime.explain")    # the package names the function so
    monkeypatch.setattr(explain_module, "graphviz_renders", lambda: False)
    drawn = {}
    monkeypatch.setattr(networkx, "draw_networkx", lambda graph, pos, **kw: drawn.update(graph=graph, **kw))
    report = gnnfuse.explain(GATConv(6, 2, heads=2).double(), torch.randn(5, 6, dtype=torch.float64), _graph())
    report.render(tmp_path / "gat.png")
    graph, colors = drawn["graph"], dict(zip(drawn["nodelist"], drawn["node_color"]))
    dot = report.to_dot()
    assert all(f"{node} [label" in dot for node in graph.nodes if not node.endswith("_title"))
    assert set(graph.edges) == {tuple(edge.split(" -> ")) for edge in re.findall(r"^\s*(\w+ -> \w+);", dot, re.M)}
    units = [s for s in report.programs[0].forward.steps if s.fused]
    recomputed = {v.id for v in units[0].body} & {v.id for v in units[1].body}
    assert recomputed
    for k, unit in enumerate(units):
        colour = colors[f"p1f_{unit.writes[0].id}"]     # the forward's unit k: its nodes, and no others
        mine = [node for node in graph.nodes if node.startswith("p1f_") and colors[node] == colour]
        assert len(mine) == len(unit.body) + len(unit.writes)
        assert all(any(node.endswith(f"_u{k}_{i}") for node in mine) for i in recomputed & {v.id for v in unit.body})


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_unit_mixing_float64_with_float32_is_listed_as_the_torch_ops_it_runs(backend, monkeypatch):
    """Both backends run a unit mixing float64 and float32 values as torch ops
    (backend/unit_ops.py), which write the gathered [E, 3] rows; explain listed one fused
    unit and 'edge-rowed tensors written: none' (the cpu backend's warning is given once
    per process, so a later explain had nothing else to say it)."""
    if backend == "cpu":
        pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", backend)
    device = "cpu"      # both backends run host tensors (never Triton)
    graph = _graph()
    h = torch.randn(5, 3, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(5, 1, dtype=torch.float32, device=device)
    with warnings.catch_warnings():     # the cpu backend's, once per process
        warnings.simplefilter("ignore", RuntimeWarning)
        report = gnnfuse.explain(_neighbour_sum, graph, {"h": h, "w": w})
    forward = report.programs[0].forward
    assert not any(s.fused for s in forward.steps)
    assert [s.item.op for s in forward.steps] == ["mul", "broadcast", "reduce"]
    [gathered] = forward.edge_tensors
    assert forward.edge_tensor_bytes == graph.num_edges * 3 * 8 and gathered.value.op == "broadcast"
    assert "run as torch ops: " in str(report) and "mixes torch.float32 and torch.float64 values" in str(report)


class _EdgeRowsWritten(TorchDispatchMode):
    """Bytes of the floating tensors with ``rows`` rows that ops write (views excepted; index
    arrays, such as a CSR built on first use, are the graph's), per phase."""

    def __init__(self, rows: int):
        super().__init__()
        self.rows, self.phase, self.bytes = rows, "forward", {"forward": 0, "backward": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(view in str(func) for view in ("view", "reshape", "transpose", "narrow", "expand", "alias",
                                                  "detach", "set_")):   # set_: Triton's interpreter, no copy
            self.bytes[self.phase] += sum(t.numel() * t.element_size() for t in tree_flatten(out)[0]
                                          if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim()
                                          and t.shape[0] == self.rows)
        return out


def test_a_sum_by_edge_type_whose_operand_mixes_floats_lists_the_torch_ops_it_runs(monkeypatch):
    """A per-type parameter's gradient is a sum by edge type (passes/type_sums.py); riding
    no walk, it runs as its operand's edge unit and a torch sum, and that edge unit, mixing
    float64 gradients with float32 rows, runs as torch ops on the Triton backend
    (`unit_ops.mixed_floats`). explain listed it as one unit: 3,600 B reported per edge in
    the backward, 5,760 B written (counted under Triton's interpreter)."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "rows")
    device = device_for("triton")
    gen = torch.Generator().manual_seed(0)
    src, dst, types = (torch.randint(0, n, (90,), generator=gen) for n in (20, 20, 3))
    graph = gnnfuse.Graph(src, dst, 20, edge_type=types, num_edge_types=3).to(device)
    h = torch.randn(20, 2, generator=gen).to(device).requires_grad_()
    p = torch.randn(3, 2, dtype=torch.float64, generator=gen).to(device).requires_grad_()
    layer = gnnfuse.vertex(lambda v: sum([e.src.h * e.type.p for e in v.inedges]))
    written = _EdgeRowsWritten(graph.num_edges)
    with warnings.catch_warnings():     # the backend's, once per process
        warnings.simplefilter("ignore", RuntimeWarning)
        report = gnnfuse.explain(lambda: layer(graph, {"h": h}, None, etype_feature={"p": p}))
        with written:
            out = layer(graph, {"h": h}, None, etype_feature={"p": p})
            written.phase = "backward"
            out.sum().backward()
    [program] = report.programs
    assert (program.forward.edge_tensor_bytes, program.backward.edge_tensor_bytes) == \
        (written.bytes["forward"], written.bytes["backward"])
    assert program.backward.steps[-1].item.attrs["by"] == "etype" and not program.backward.steps[-2].fused


def test_the_cpu_backends_units_without_kernels_are_listed_as_the_torch_ops_they_run(monkeypatch):
    """The cpu backend has no kernels for int16 data: a unit reading an int16 table runs as
    torch ops (backend/cpu/executor.py `by_ops_reason`), after a warning given once per
    process. explain listed it as one fused unit writing nothing per edge, where the run
    wrote the gathered [E, 3] float32 rows (84 B); it now lists the ops, with the reason,
    and its per-edge bytes are those the run writes, forward and backward."""
    pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    device = "cpu"      # the cpu backend's units run host tensors
    graph = _graph()
    feeds = {"h": torch.randn(5, 3, device=device, requires_grad=True),
             "w": torch.tensor([[1], [2], [3], [4], [5]], dtype=torch.int16, device=device)}
    written = _EdgeRowsWritten(graph.num_edges)
    with warnings.catch_warnings():     # the cpu backend's, once per process
        warnings.simplefilter("ignore", RuntimeWarning)
        report = gnnfuse.explain(_neighbour_sum, graph, feeds)
        with written:
            out = _neighbour_sum(graph, feeds)
            written.phase = "backward"
            out.sum().backward()
    [program] = report.programs
    assert not any(s.fused for s in program.forward.steps)
    assert (program.forward.edge_tensor_bytes, program.backward.edge_tensor_bytes) == \
        (written.bytes["forward"], written.bytes["backward"]) == (graph.num_edges * 3 * 4, 0)
    assert "run as torch ops: gnnfuse cpu backend: no kernels for torch.int16 data" in str(report)


def test_a_sum_over_every_edge_the_cpu_backend_runs_as_torch_ops_lists_them(monkeypatch):
    """The cpu backend runs a sum over every edge (the backward's into a weight and a
    scale shared by every edge) as its per-edge operand's edge unit and a torch sum; with
    float64 rows beside float32 weights that edge unit runs as torch ops, which explain
    listed as one fused unit: 7,840 B per edge written in the backward, 5,376 B reported."""
    pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    device = "cpu"      # the cpu backend's units run host tensors
    graph = _graph()
    w, b = torch.randn(3, 8, device=device, requires_grad=True), torch.randn(4, device=device, requires_grad=True)
    h = torch.randn(5, 2, 4, dtype=torch.float64, device=device, requires_grad=True)
    a = torch.randn(graph.num_edges, 3, device=device)

    @gnnfuse.vertex
    def layer(v):
        return sum([(e.a @ w).view(2, 4) * (e.src.h + e.dst.h) * b for e in v.inedges])

    written = _EdgeRowsWritten(graph.num_edges)
    with warnings.catch_warnings():     # the cpu backend's, once per process
        warnings.simplefilter("ignore", RuntimeWarning)
        report = gnnfuse.explain(layer, graph, {"h": h}, {"a": a})
        with written:
            out = layer(graph, {"h": h}, {"a": a})
            written.phase = "backward"
            out.sum().backward()
    [program] = report.programs
    assert (program.forward.edge_tensor_bytes, program.backward.edge_tensor_bytes) == \
        (written.bytes["forward"], written.bytes["backward"])
    first = program.backward.steps[0]    # the operand of the sum into the scale, its ops
    assert not first.fused and "run as torch ops: " in first.label and "mixes torch.float32 and torch.float64" \
        in first.label


def test_explain_before_training_leaves_the_random_draws_of_later_steps_alone():
    """explain runs the call once, dropout included: a model explained after seeding drew
    other masks in its next forward than one never explained, so its training differed."""
    graph = _graph()
    x = torch.randn(5, 6)
    conv = GATConv(6, 2, heads=2, dropout=0.5).train()

    def model(x, graph):
        return conv(gnnfuse.nn.functional.dropout(x, 0.5, True), graph)
    outputs = []
    for explain_first in (False, True):
        torch.manual_seed(0)
        if explain_first:
            gnnfuse.explain(model, x, graph)
        outputs.append(model(x, graph))
    assert torch.equal(*outputs)


@pytest.mark.parametrize("tiled", ["0", "1"])
def test_the_cpu_backend_is_not_advised_a_setting_it_does_not_read(tiled, monkeypatch):
    """The cpu backend writes GATv2's per-edge scores whatever GNNFUSE_TILED_SCORES says;
    its plans advised 'GNNFUSE_TILED_SCORES=1 recomputes them', which changed nothing, and
    under =1 called the scores tiled while the run wrote them."""
    pytest.importorskip("numba")
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    monkeypatch.setenv("GNNFUSE_TILED_SCORES", tiled)
    device = "cpu"      # the cpu backend's host tensors
    conv = gnnfuse.nn.GATv2Conv(6, 2, heads=2).to(device)
    report = gnnfuse.explain(conv, torch.randn(5, 6, device=device, requires_grad=True), _graph().to(device))
    forward = report.programs[0].forward
    assert not forward.tiled_scores and [t.value.op for t in forward.edge_tensors] == ["sum_dim"]
    assert "GNNFUSE_TILED_SCORES" not in str(report)


def test_a_call_without_compiled_programs_says_so():
    report = gnnfuse.explain(lambda: 3)
    assert report.result == 3 and report.programs == []
    assert "ran no compiled" in str(report)


def test_explain_rejects_a_non_callable():
    import pytest
    with pytest.raises(TypeError, match="callable"):
        gnnfuse.explain(42)


def test_cli_explain_prints_plans_and_writes_graph(tmp_path, capsys):
    out = tmp_path / "gcn.png"
    assert main(["explain", "--model", "gcn", "--dataset", "synthetic", "--graph", str(out),
                 "--dot", str(tmp_path / "gcn.dot")]) == 0
    text = capsys.readouterr().out
    assert "fused unit" in text and "bytes:" in text and "N=2,000" in text
    assert out.stat().st_size > 0 and (tmp_path / "gcn.dot").read_text().startswith("digraph")


def test_cli_explain_cuda_without_cuda_is_a_usage_error(capsys):
    import pytest
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", "--device", "cuda"])
    assert exit_info.value.code == 2 and "CUDA is not available" in capsys.readouterr().err


def test_cli_explain_cuda_without_cuda_is_refused_before_the_data_set_loads(monkeypatch, capsys):
    """The check came after loading the data set: ogbn-products took minutes to read,
    then the command said CUDA was not available (bench and tune check first)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("gnnfuse.cli_explain.load_node_dataset", lambda *a: pytest.fail("loaded the data set"))
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", "--device", "cuda", "--dataset", "synthetic"])
    assert exit_info.value.code == 2 and "CUDA is not available" in capsys.readouterr().err


def test_explain_counts_the_edge_parallel_schedule_by_its_own_byte_model(monkeypatch):
    """The same unit under the COO schedule gathers its own row per edge, reads both
    endpoint arrays and writes with one atomic read-modify-write per edge."""
    pytest.importorskip("triton")
    graph = gnnfuse.Graph(torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 2, 0, 3, 0]), 4)

    @gnnfuse.vertex
    def scaled_sum(v):
        return sum([u.h * v.s for u in v.innbs])
    feats = {"h": torch.randn(4, 8), "s": torch.randn(4, 1)}
    steps = {}
    for schedule in ("csr", "coo"):
        monkeypatch.setenv("GNNFUSE_SCHEDULE", schedule)
        report = gnnfuse.explain(scaled_sum, graph, feats)
        (step,) = [s for s in report.programs[0].forward.steps if s.fused]
        assert f"[{schedule} schedule on CUDA]" in step.label
        steps[schedule] = step.traffic
    n, e, row = 4, 5, 8 * 4
    idx = torch.empty((), dtype=graph.index_dtype).element_size()
    assert steps["csr"].writes == n * row
    assert steps["coo"].writes == 2 * e * row
    assert steps["coo"].index == 2 * e * idx
    assert steps["coo"].reads == e * row + e * 4     # h and s both gathered per edge
    assert steps["csr"].reads == e * row + n * 4     # s read once per vertex


def test_a_kernel_printed_says_the_constants_it_runs_with():
    """A program's constants reach its kernels as arguments (backend/constant_args.py), so
    the source no longer shows them: the listing ends with their values."""
    tau = 0.37

    def layer(h, graph):
        return frontend.message_passing(graph, lambda e: {"m": e.src["h"] / tau + 0.25},
                                        lambda n: {"o": torch.sum(n.mailbox["m"], 1)}, ndata={"h": h})["o"]
    report = gnnfuse.explain(layer, torch.randn(5, 6), _graph(), source=True)
    [kernel] = [s.source for p in report.programs for s in p.forward.steps if s.fused]
    assert "0.37" not in kernel.split("# run with")[0] and "K0" in kernel
    assert "K0 = 0.37" in kernel and "K1 = 0.25" in kernel, kernel[-300:]


def test_an_online_softmax_group_is_one_kernel_where_the_executor_runs_one(monkeypatch):
    """GAT's forward max, normalizer and weighted sum walk the dst CSR in one sibling
    kernel wherever the group takes its maximum online: the executor runs every member in
    the CSR schedule then, whatever the cost rule picks for the sums alone. On a 30-vertex,
    144-edge graph the rule picks COO for the sums, and explain said each unit "runs on its
    own here" (three kernels' bytes) where the Triton backend launched one
    ``fused_siblings`` kernel (counted under Triton's interpreter)."""
    monkeypatch.delenv("GNNFUSE_SCHEDULE")
    torch.manual_seed(0)
    graph = gnnfuse.Graph.from_edge_index(torch.randint(0, 30, (2, 120)), 30)
    report = gnnfuse.explain(GATConv(8, 4, heads=2), torch.randn(30, 8), graph)
    [program] = report.programs
    units = [s for s in program.forward.steps if s.fused]
    assert len(units) == 3
    assert all("shares one kernel with the 2 other unit(s)" in s.label for s in units), units[1].label


def test_sibling_kernels_turned_off_are_reported_as_units_on_their_own(monkeypatch):
    """With ``GNNFUSE_SIBLING_KERNELS=0`` the Triton backend runs a sibling group's members
    one by one (`_plan_siblings` gives no launch). explain's copy of the executor's rule
    left the switch out: GAT's softmax group was reported as one kernel, its sums taking
    the maximum online and reading no stored maximum. It now asks the executor
    (`members_run_as_one`), and members run apart read the maximum stored before them."""
    from gnnfuse.backend.triton import executor as triton_executor
    monkeypatch.delenv("GNNFUSE_SCHEDULE")
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    monkeypatch.setenv("GNNFUSE_SIBLING_KERNELS", "0")
    device = device_for("triton")
    planned, real = [], triton_executor._plan_siblings
    monkeypatch.setattr(triton_executor, "_plan_siblings", lambda *a: planned.append(real(*a)) or planned[-1])
    torch.manual_seed(0)
    with torch.device(device):
        graph = gnnfuse.Graph.from_edge_index(torch.randint(0, 30, (2, 120)), 30)
        report = gnnfuse.explain(GATConv(8, 4, heads=2), torch.randn(30, 8), graph)
    [program] = report.programs
    units = [s for s in program.forward.steps if s.fused]
    assert planned and all(p is None for p in planned)      # the executor ran them apart
    assert len(units) == 3 and all("runs on its own here" in s.label for s in units), units[1].label
    # apart, the sums read the maximum the first unit stored, rather than take it online
    assert not any("online" in s.label for s in units)
    assert any(v.op == "reduce" and v.attrs["op"] == "max" for s in units[1:] for v, _ in s.reads)


def test_one_program_on_two_graphs_of_one_size_is_reported_per_graph():
    """A program's report is of one graph: one SAGEConv called on two bipartite blocks of
    10 destinations and 500 edges, from 1,000 and from 20 sources, was reported once, "ran
    2x on a graph with 1,000 sources", its backward writing 32,000 B of source rows where
    the second call wrote 640 B (the report's key left the source count out)."""
    torch.manual_seed(0)
    conv = gnnfuse.nn.SAGEConv((16, 16), 8)
    graphs = [gnnfuse.Graph.bipartite(torch.randint(0, n, (500,)), torch.randint(0, 10, (500,)), n, 10)
              for n in (1000, 20)]
    xs = [torch.randn(g.num_src_nodes, 16, requires_grad=True) for g in graphs]
    x_dst = torch.randn(10, 16)
    report = gnnfuse.explain(lambda: sum(conv((x, x_dst), g).sum() for x, g in zip(xs, graphs)))
    assert [p.calls for p in report.programs] == [1, 1]
    assert [p.call.graph for p in report.programs] == graphs
    for program, graph in zip(report.programs, graphs):
        [unit] = [s for s in program.backward.steps if s.fused]
        assert unit.traffic.writes == graph.num_src_nodes * 8 * 4     # one row per source (the CSR schedule)


def test_a_source_side_table_of_a_bipartite_graph_is_counted_with_the_source_rows():
    """A per-vertex value of the source side (a gradient summed by source, the source
    features) has one row per source. explain counted every per-vertex value with the
    destinations' rows: the backward of a SAGEConv with aggr=['mean', 'max', 'std'] on
    1,000 sources and 10 destinations multiplies two [1000, 16] float32 tables, 128,000 B
    read and 64,000 B written, reported as 1,280 B and 640 B."""
    torch.manual_seed(0)
    graph = gnnfuse.Graph.bipartite(torch.randint(0, 1000, (500,)), torch.randint(0, 10, (500,)), 1000, 10)
    conv = gnnfuse.nn.SAGEConv((16, 16), 8, aggr=["mean", "max", "std"])
    x_src = torch.randn(1000, 16, requires_grad=True)
    report = gnnfuse.explain(conv, (x_src, torch.randn(10, 16)), graph)
    [program] = report.programs
    [mul] = [s for s in program.backward.steps if not s.fused and s.item.op == "mul"]
    row = 16 * 4
    assert (mul.traffic.reads, mul.traffic.writes) == (2 * 1000 * row, 1000 * row)
    [degree] = [s for s in program.forward.steps if not s.fused and s.item.op == "degree"]
    assert degree.traffic.writes == 10 * 8      # the destinations' in-degrees, int64


def test_cli_explain_writes_dot_into_a_pipe_and_leaves_it_a_pipe(tmp_path, capsys):
    """--dot /dev/stdout (or a named pipe) was replaced by a regular file -- the atomic
    write renames a temporary file over the target, which as root replaces even
    /dev/null -- and the reader got nothing; a folder the user cannot write (/dev) was
    also refused up front. A device, pipe or socket is now written in place."""
    import os
    import stat
    import threading
    import time
    pipe = tmp_path / "dot.fifo"
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)     # a reader, so the command's open does not block
    received, done = [], threading.Event()

    def read() -> None:        # drains the pipe as the command writes (its buffer is 64 KiB)
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk:
                received.append(chunk)
            elif done.is_set():
                return
            else:
                time.sleep(0.01)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert main(["explain", "--model", "gcn", "--dataset", "synthetic", "--dot", str(pipe)]) == 0
    finally:
        done.set()
        reader.join()
        os.close(fd)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode) and b"".join(received).startswith(b"digraph")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dot.fifo"]


def test_the_edge_count_note_counts_one_self_loop_per_vertex_for_gcn():
    """GCN replaces the graph's self loops by one per vertex: edges (0, 0), (0, 1) and
    (2, 1) on 3 vertices run as 2 + 3 = 5 edges, not 3 + 3."""
    from gnnfuse.cli_explain import edge_count_note
    graph = gnnfuse.Graph(torch.tensor([0, 0, 2]), torch.tensor([0, 1, 1]), 3)
    note = edge_count_note("tiny", graph, gnnfuse.nn.GCNConv(2, 2))
    assert note.startswith("tiny: 3 nodes, 3 edges") and note.endswith("so the programs below run on 5 edges")
