"""The smallest blocks of the CSR kernels' autotuning space (`codegen.CSR_EDGE_BLOCKS`,
`codegen.CSR_ROWS`: 4-edge chunks, 16 segments per program), which the autotuner may
pick on low-degree graphs and the interpreter's fixed config never runs: a GAT layer's
forward and backward (the sibling kernel included) and a mean aggregation, against the
reference in float64, on a graph whose hub row is split into segments."""
from __future__ import annotations

import pytest
import torch

from gnnfuse import nn as gnn
from gnnfuse.backend.triton import codegen
from gnnfuse.backend.triton import executor as triton_executor
from gnnfuse.frontend.trace_cache import clear_trace_caches
from gnnfuse.runtime import compiled as compiled_module
from test_triton_backend import DEVICE, hub_graph

LAYERS = {"gat": lambda: gnn.GATConv(6, 4, heads=2), "sage": lambda: gnn.SAGEConv(6, 5, aggr="mean")}


@pytest.mark.parametrize("name", list(LAYERS))
def test_smallest_autotuned_blocks_match_the_reference(name, monkeypatch):
    smallest = {"BLOCK_E": min(codegen.CSR_EDGE_BLOCKS), "ROWS": max(codegen.CSR_ROWS)}
    monkeypatch.setattr(triton_executor, "fixed_csr_blocks", lambda block_f: dict(smallest))
    monkeypatch.setattr(triton_executor, "SEGMENT_EDGES", 64)    # the hub row splits: atomic stores too
    monkeypatch.setenv("GNNFUSE_SCHEDULE", "csr")
    graph = hub_graph().to(DEVICE)
    x = torch.randn(graph.num_nodes, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    results = {}
    for backend in ("triton", "reference"):
        monkeypatch.setenv("GNNFUSE_BACKEND", backend)
        compiled_module._BY_STRUCTURE.clear()
        clear_trace_caches()
        torch.manual_seed(3)
        layer = LAYERS[name]().double().to(DEVICE)
        xs = x.clone().requires_grad_()
        out = layer(xs, graph)
        weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype, device=out.device).view_as(out)
        results[backend] = [out.detach(), *torch.autograd.grad((out * weight).sum(), [xs, *layer.parameters()])]
    for got, want in zip(results["triton"], results["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_a_tuned_kernel_loads_with_warnings_as_errors(tmp_path):
    """A tuned kernel's decorator gave Triton's autotuner ``warmup=3, rep=10``, which
    Triton deprecated (3.6 warns as each kernel module loads): on a GPU, a program run
    with warnings as errors (``-W error``, pytest's filterwarnings) failed to load any
    tuned kernel. The timing settings travel in ``do_bench`` where Triton takes it. The
    module is loaded from a file, as the kernel cache loads it (``triton.jit`` outside
    the interpreter reads its function's source)."""
    import importlib.util
    import warnings
    decorator = codegen._decorator(True, {"BLOCK_E": (4, 8)}, "size_class", False)
    path = tmp_path / "tuned_kernel.py"
    path.write_text(f"import triton\nimport triton.language as tl\n\n\n{decorator}\n"
                    "def kernel(x, size_class, BLOCK_E: tl.constexpr):\n    pass\n")
    spec = importlib.util.spec_from_file_location("tuned_kernel", path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
