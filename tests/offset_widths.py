"""Which pointer offsets a Triton kernel computes as 32-bit products of loaded indices.

A row index loaded from an int32 tensor stays int32 in Triton, and so does its product
with a stride that fits int32: ``index * stride`` wraps once the table it addresses
holds 2^31 elements or more (a 2.4M-row table of 1024 columns), and the kernel reads or
writes the wrong row without an error. Showing that on a table that large needs a GPU;
the product's width shows without one: the kernel is compiled for an sm_90 target
(Triton compiles on a machine without a GPU) and its Triton IR searched for 32-bit
multiplications of loaded values that feed pointer arithmetic.
"""
from __future__ import annotations

import re
import warnings

import pytest

_DEF = re.compile(r"^\s*(%[\w.#]+)(?::\d+)? = ([\w.]+) (.*?)(?: loc\(.*)?$")
_NAME = re.compile(r"%[\w.#]+")
# ops an offset passes through unchanged in kind (a loaded index stays one through them)
_THROUGH = {"arith.addi", "arith.subi", "arith.muli", "arith.select", "arith.extsi", "arith.trunci",
            "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape"}


def triton_ir(fn, signature: dict[str, str], constexprs: dict[str, object]) -> str:
    """``fn`` (a ``triton.jit`` function) compiled for an sm_90 GPU: its Triton IR; the
    test is skipped where this Triton cannot compile for that target."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction
    if not isinstance(fn, JITFunction):     # under TRITON_INTERPRET=1: the interpreter's wrapper
        fn = JITFunction(fn.fn)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", 90, 32))
    except (RuntimeError, ImportError, FileNotFoundError) as exc:   # no CUDA toolchain in this Triton
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    return compiled.asm["ttir"]


def narrow_index_products(ir: str) -> list[str]:
    """The 32-bit (``i32``) multiplications in ``ir`` that feed a pointer offset
    (``tt.addptr``) and take a value derived from a load (a row index read from memory),
    as IR lines: each is an ``index * stride`` that wraps on a table of 2^31 elements."""
    defs: dict[str, tuple[str, str]] = {}
    for line in ir.splitlines():
        match = _DEF.match(line)
        if match:
            defs[match.group(1)] = (match.group(2), match.group(3))

    def operands(rest: str) -> list[str]:
        return _NAME.findall(rest.split(" : ")[0])

    def loaded(name: str, seen: set[str]) -> bool:
        if name in seen or name not in defs:
            return False
        seen.add(name)
        op, rest = defs[name]
        return op == "tt.load" or (op in _THROUGH and any(loaded(o, seen) for o in operands(rest)))

    found = []
    for op, rest in defs.values():
        if op != "tt.addptr":
            continue
        stack, seen = [operands(rest)[1]], set()
        while stack:
            name = stack.pop()
            if name in seen or name not in defs:
                continue
            seen.add(name)
            inner, inner_rest = defs[name]
            narrow = inner_rest.split(" : ")[-1].strip().endswith(("xi32>", "i32"))
            if inner == "arith.muli" and narrow and any(loaded(o, set()) for o in operands(inner_rest)):
                found.append(f"{name} = {inner} {inner_rest.strip()}")
            if inner in _THROUGH:
                stack.extend(operands(inner_rest))
    return found
