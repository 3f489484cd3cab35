"""An edge-parallel kernel of one lane per edge passes no operand through shared memory
at any edge block it may launch with (`codegen.EDGE_BLOCKS`, and
`executor.fixed_edge_block` on a GPU).

Why: Triton 3.6 loaded each operand of a 256-edge block two edges per thread and moved
it into the tile's layout through shared memory, every operand through the same
addresses, and ptxas (12.8 to 13.0, sm_90) took two values loaded from one address
across the barrier for one value. ``x * w`` was then "a square", and ``sqrt(|x * w|)``
lost the ``|.|`` for the first edge of each pair: NaN for 1,007 of 4,096 edges on an
H200, no error (tests/test_gpu_rounding.py). The kernels are compiled here for sm_90
without a GPU (Triton ships ptxas) and their PTX read; newer Triton versions choose
layouts that need no shared memory at these blocks, so there the test checks that the
blocks stay so. (Wider rows load each operand as a [BLOCK_E, BLOCK_F] tile in place;
only the edge ids may move between layouts there, each through addresses of its own.)
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
import triton

import gnnfuse
from gnnfuse.backend.triton import executor
from gnnfuse.backend.triton.codegen import EDGE_BLOCKS
from gnnfuse.runtime.explain import explain
from oracle_check import device_for

pytestmark = pytest.mark.skipif("nvidia" not in getattr(triton.backends, "backends", {}),
                                reason="this Triton has no CUDA backend to compile with")

_INTEGERS = {"num_edges", "size_class"}


OPERANDS = {
    "source and edge": (lambda a, b: torch.sqrt((a * b).abs()), ("src", "edge")),
    "source and destination": (lambda a, b: torch.relu(a * b), ("src", "dst")),
}


def _edge_kernel_source(fn, operands: tuple[str, str], monkeypatch) -> str:
    """The generated kernel of ``fn`` per edge over two one-lane ``operands``."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    n = 8
    graph = gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n).to(device)
    tables = {name: torch.randn(n, 1, device=device) for name in operands}
    report = explain(lambda: gnnfuse.ops.gsddmm(graph, fn, **tables), source=True)
    sources = [step.source for program in report.programs for step in program.forward.steps if step.source]
    assert len(sources) == 1 and "def fused_edge(" in sources[0], sources
    return "\n".join(line for line in sources[0].splitlines() if not line.startswith("@triton.autotune"))


def _ptx(source: str, block_e: int, block_f: int, tmp_path) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    path = tmp_path / f"edge_{block_e}_{block_f}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = module.fused_edge
    signature = {name: ("constexpr" if name.startswith("BLOCK_") else "i32" if name in _INTEGERS
                        else "*i32" if name in ("src", "dst") else "*fp32") for name in kernel.arg_names}
    # as the launcher specializes a launch on 16-byte aligned tensors and an edge count
    # divisible by 16: the case in which the loads vectorize
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if signature[name].startswith("*") or name == "num_edges"}
    compiled = triton.compile(ASTSource(kernel, signature, {"BLOCK_E": block_e, "BLOCK_F": block_f}, aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return compiled.asm["ptx"]


@pytest.mark.parametrize("operands", OPERANDS)
def test_one_lane_edge_kernels_stage_no_operand_through_shared_memory(operands, monkeypatch, tmp_path):
    fn, names = OPERANDS[operands]
    source = _edge_kernel_source(fn, names, monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "0")      # the edge block a GPU launches without autotuning
    for block_e in sorted({*EDGE_BLOCKS, executor.fixed_edge_block(1)}):
        ptx = _ptx(source, block_e, 1, tmp_path)
        assert "mul.f32" in ptx
        assert "st.shared" not in ptx, f"BLOCK_E={block_e}: an operand passes through shared memory"
