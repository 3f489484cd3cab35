"""No generated kernel multiplies two values it read from the same shared-memory address,
at any configuration its autotuner may pick or its untuned launch uses.

Why: Triton (3.6 and 3.9 alike) moves a one-lane operand loaded two edges per thread
into the tile's layout through shared memory, every operand through the same scratch
addresses; ptxas (12.8 to 13.0, sm_90) then takes the two reads of one address across
the barrier for one value, so ``x * w`` is "a square" and the sign handling of
``|x * w|``, ``relu(x * w)`` or ``where(x * w < 0, ...)`` is dropped for the first
element of each register pair: ``sqrt(|x * w|)`` came out NaN for 1,007 of 4,096 edges on
an H200, without an error. At the edge kernels' blocks (`codegen.EDGE_BLOCKS`, 128 at
most) no one-lane operand passes through shared memory at all, which is checked too.
The scan kernel (`codegen.generate_scan`) did the same at 256 edges over four warps:
``relu(u.h * v.h)`` summed over a sparse graph's one-lane rows, compiled with Triton
3.6's ptxas, kept ``FSETP``/``FSEL`` for the second product of each pair only.

The check reads the PTX, compiled for sm_90 without a GPU: a ``mul``/``fma`` whose two
operands come from ``ld.shared`` of the same address and element is the pattern ptxas
mistook for a square. An audit of the CSR, rows, COO, edge, scan, sibling and
shared-reduce kernels (sum/mean/max of ``u.h * e.w``, ``relu(u.h * v.h)``,
``sqrt(|u.h * e.w|)`` at 1-64 lanes, GAT/GATv2, float32/64, every tuned config and the
untuned one, Triton 3.6) found such a product only in these two families; elsewhere
shared memory carries edge ids, reductions and finished rows, except in GAT's tiled
sibling kernel, whose untuned launch (128 edges, four warps) divides two per-edge values
read from one address: its SASS divides two registers, and nothing after it tests a sign.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import gnnfuse
from gnnfuse.backend.triton import executor
from gnnfuse.runtime.explain import explain

pytestmark = pytest.mark.skipif("nvidia" not in getattr(triton.backends, "backends", {}),
                                reason="this Triton has no CUDA backend to compile with")

_INTEGERS = {"num_edges", "size_class", "out_numel"}
_INDEXES = {"col", "rows", "eid", "degree", "src", "dst"}
_LOAD = re.compile(r"ld\.shared(?:\.v\d)?\.\w+\s+(\{[^}]*\}|%\w+),\s*\[([^\]]+)\]")
_PRODUCT = re.compile(r"^(?:@!?%\w+\s+)?(?:mul|fma|mad)\.\S*f(?:32|64)\s+%\w+,\s*(%\w+),\s*(%\w+)")
_COPY = re.compile(r"^(?:mov|cvt)\.\S+\s+(%\w+),\s*(%\w+);")
_DEFINES = re.compile(r"^(?:@!?%\w+\s+)?[a-z][\w.]*\s+(%\w+)")


def squares(ptx: str) -> list[str]:
    """The float products in ``ptx`` whose two operands (through copies) were read from
    one shared-memory address and element: what ptxas took for ``x * x``."""
    read_from: dict[str, tuple[str, int]] = {}     # register -> (address, element) it was read from
    found = []
    for line in (raw.strip() for raw in ptx.splitlines()):
        load = _LOAD.search(line)
        if load:
            for k, reg in enumerate(r.strip() for r in load.group(1).strip("{}").split(",")):
                read_from[reg] = (load.group(2).replace(" ", ""), k)
            continue
        copy = _COPY.match(line)
        if copy and copy.group(2) in read_from:
            read_from[copy.group(1)] = read_from[copy.group(2)]
            continue
        product = _PRODUCT.match(line)
        if product and product.group(1) != product.group(2) and product.group(1) in read_from \
                and read_from[product.group(1)] == read_from.get(product.group(2)):
            found.append(line)
        defined = _DEFINES.match(line)
        if defined:
            read_from.pop(defined.group(1), None)
    return found


MESSAGES = {
    "relu(u * v)": (lambda u, v: torch.relu(u * v), ("src", "dst")),
    "sqrt(|u * e|)": (lambda u, e: torch.sqrt((u * e).abs()), ("src", "edge")),
}
# The kernel families where the pattern was found, by schedule: the kernel's name and how
# a one-lane ``message`` reaches it (a sum over a sparse graph takes the scan schedule)
FAMILIES = {"scan": ("fused_aggregate_scan", lambda graph, fn, tables: gnnfuse.ops.gspmm(graph, fn, "sum", **tables)),
            "edge": ("fused_edge", lambda graph, fn, tables: gnnfuse.ops.gsddmm(graph, fn, **tables))}


def _tuned_source(family: str, message: str, monkeypatch) -> str:
    """The ``family`` kernel of ``message`` over one-lane rows, as a GPU gets it: behind
    its autotuner. It runs on the CPU backend (`explain` generates the Triton plan's
    sources either way): a kernel run in Triton's interpreter leaves
    ``triton.language`` patched, and the compile fails."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "cpu")
    fn, names = MESSAGES[message]
    n = 16
    graph = gnnfuse.Graph(torch.arange(n), (torch.arange(n) + 1) % n, n)   # degree 1
    tables = {name: torch.randn(n, 1) for name in names}
    seen = []
    real = executor.kernel_source
    monkeypatch.setattr(executor, "kernel_source", lambda unit, acc, schedule: seen.append((unit, acc, schedule))
                        or real(unit, acc, schedule))
    explain(lambda: FAMILIES[family][1](graph, fn, tables), source=True)
    unit, acc, _ = next(s for s in seen if s[2] == family)
    name, generate = executor._GENERATORS[family]
    return generate(unit, name, acc, tuned=True)[0]


def _configs(family: str, source: str, monkeypatch) -> list[tuple[int, int]]:
    """(BLOCK_E, warps) of every config in ``source``'s autotuner, and the untuned
    launch's on a GPU (``GNNFUSE_AUTOTUNE=0``: Triton's default four warps)."""
    tuned = [(int(b), int(w)) for b, w in re.findall(r"triton\.Config\(\{'BLOCK_E': (\d+)\}, num_warps=(\d+)\)",
                                                       source)]
    assert tuned, source.splitlines()[4]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    fixed = executor.fixed_edge_block(1) if family == "edge" else executor.FIXED_SCAN_BLOCK
    return sorted({*tuned, (fixed, 4)})


# The child compiling a kernel file's function NAME for sm_90 at each (BLOCK_E, warps)
# (BLOCK_F = 1 where the kernel takes one),
# writing each config's PTX beside the file. A child: a process that imported Triton with
# TRITON_INTERPRET=1 (conftest) holds interpreter versions of Triton's standard-library
# functions (``tl.cdiv``, ``tl.sum``), which the compiler cannot inline.
_COMPILE = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, name, configs, integers, indexes = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("kernel", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
kernel = getattr(module, name)
signature = {p: ("constexpr" if p.startswith("BLOCK_") else "i32" if p in integers else "*i32" if p in indexes else "*fp32")
             for p in kernel.arg_names}
# as the launcher specializes a launch on 16-byte aligned tensors and counts divisible by
# 16: the case in which the index loads vectorize
aligned = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.arg_names)
           if signature[p].startswith("*") or p in ("num_edges", "out_numel")}
for block_e, warps in configs:
    constexprs = {"BLOCK_E": block_e, **({"BLOCK_F": 1} if "BLOCK_F" in kernel.arg_names else {})}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with open(f"{path}.{block_e}x{warps}.ptx", "w") as out:
        out.write(compiled.asm["ptx"])
"""


def _ptx(source: str, name: str, configs: list[tuple[int, int]], folder) -> dict[tuple[int, int], str]:
    """``source``'s kernel ``name`` compiled for sm_90 at each (BLOCK_E, warps) of
    ``configs``: its PTX by config."""
    path = folder / f"{name}.py"
    path.write_text("\n".join(line for line in source.splitlines() if not line.startswith("@triton.autotune")))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", _COMPILE, json.dumps([str(path), name, configs, sorted(_INTEGERS),
                                                                sorted(_INDEXES)])], check=True, env=env)
    return {(b, w): Path(f"{path}.{b}x{w}.ptx").read_text() for b, w in configs}


def test_squares_finds_the_pattern_ptxas_misread():
    """The checker flags two reads of one address multiplied, and nothing else."""
    ptx = """
        ld.shared.v2.b32 {%r1, %r2}, [%r9];
        bar.sync 0;
        ld.shared.v2.b32 {%r3, %r4}, [%r9];
        mov.b32 %r5, %r3;
        mul.f32 %r6, %r1, %r5;
        mul.f32 %r7, %r1, %r4;
        ld.shared.b32 %r8, [%r9+256];
        fma.rn.f32 %r10, %r2, %r8, 0f00000000;
    """
    assert squares(ptx) == ["mul.f32 %r6, %r1, %r5;"]


@pytest.mark.parametrize("message", MESSAGES)
@pytest.mark.parametrize("family", FAMILIES)
def test_one_lane_kernels_multiply_no_two_reads_of_one_shared_address(family, message, monkeypatch, tmp_path):
    source = _tuned_source(family, message, monkeypatch)
    for (block_e, warps), ptx in _ptx(source, FAMILIES[family][0], _configs(family, source, monkeypatch),
                                      tmp_path).items():
        assert re.search(r"mul\.f32|fma\.rn\.f32", ptx)
        assert not squares(ptx), (f"BLOCK_E={block_e}, num_warps={warps}: both factors of a product pass through "
                                  f"one shared-memory address: {squares(ptx)[:2]}")
        if family == "edge":      # at its blocks an edge kernel moves no one-lane operand through shared memory
            assert "st.shared" not in ptx, f"BLOCK_E={block_e}: an operand passes through shared memory"
