"""Which pointer offsets a Triton kernel computes as 32-bit products that can wrap.

A row index loaded from an int32 tensor stays int32 in Triton, and so does its product
with a stride that fits int32: ``index * stride`` wraps once the table it addresses
holds 2^31 elements or more (a 2.4M-row table of 1024 columns), and the kernel reads or
writes the wrong row without an error. So does ``tl.program_id(0) * BLOCK`` on a launch
of 2^31 items. Showing that on tensors that large needs a GPU; the products' widths show
without one: the kernel is compiled for an sm_90 target (Triton compiles on a machine
without a GPU) and its Triton IR searched for 32-bit multiplications of loaded values
(`narrow_index_products`), or of the program id (`narrow_program_products`), that feed
pointer arithmetic.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

_DEF = re.compile(r"^\s*(%[\w.#]+)(?::\d+)? = ([\w.]+) (.*?)(?: loc\(.*)?$")
_NAME = re.compile(r"%[\w.#]+")
# ops an offset passes through unchanged in kind (a loaded index stays one through them)
_THROUGH = {"arith.addi", "arith.subi", "arith.muli", "arith.select", "arith.extsi", "arith.trunci",
            "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape"}


def triton_ir(kernel, signature: dict[str, str], constexprs: dict[str, object]) -> str:
    """``kernel`` (a ``triton.jit`` function, or the interpreter's wrapper of one, whose
    body names nothing but ``triton``, ``tl`` and builtins) compiled for an sm_90 GPU:
    its Triton IR; the test is skipped where this Triton cannot compile for that target.

    Compiled in a child process from the function's source: Triton's interpreter leaves
    ``triton.language`` patched after a kernel calls a nested ``triton.jit`` function
    (``InterpretedFunction.__call__`` never restores its patch), and a test process that
    ran such a kernel fails to compile any other ('value' object has no attribute 'dtype')."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, source, kernel.fn.__name__, json.dumps(signature),
                           json.dumps(constexprs)], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode == _NO_TARGET:
        pytest.skip(f"Triton cannot compile for sm_90 here: {done.stderr.strip().splitlines()[-1:]}")
    if done.returncode:
        raise AssertionError(f"compiling {kernel.fn.__name__} for sm_90 failed:\n{done.stderr}")
    return done.stdout


_NO_TARGET = 3
# The child: the kernel's module made of its source alone, compiled for sm_90, its IR printed.
_COMPILE = f"""
import importlib.util, json, os, sys, tempfile, warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
source, name, signature, constexprs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
    file.write("import triton\\nimport triton.language as tl\\n\\n\\n" + source)
spec = importlib.util.spec_from_file_location("kernel_under_test", file.name)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
os.unlink(file.name)
fn = getattr(module, name)
fn = getattr(fn, "fn", fn) if not isinstance(fn, triton.runtime.jit.JITFunction) else fn
try:
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32))
except (ImportError, FileNotFoundError, RuntimeError) as exc:
    if isinstance(exc, RuntimeError) and "ptxas" not in str(exc):
        raise
    print(exc, file=sys.stderr)       # no CUDA toolchain in this Triton
    sys.exit({_NO_TARGET})
print(compiled.asm["ttir"])
"""


def _definitions(ir: str) -> dict[str, tuple[str, str]]:
    """Each SSA value of ``ir``: (its op, the rest of its line, location dropped)."""
    defs = {}
    for line in ir.splitlines():
        match = _DEF.match(line)
        if match:
            defs[match.group(1)] = (match.group(2), match.group(3))
    return defs


def _operands(rest: str) -> list[str]:
    """The SSA names an op's line reads (its operands, before the ``: type``)."""
    return _NAME.findall(rest.split(" : ")[0])


def _offset_producers(defs: dict[str, tuple[str, str]]):
    """Each value feeding a pointer offset (``tt.addptr``'s second operand) through ops an
    offset passes through unchanged in kind (`_THROUGH`): (name, op, rest of its line)."""
    for op, rest in list(defs.values()):
        if op != "tt.addptr":
            continue
        stack, seen = [_operands(rest)[1]], set()
        while stack:
            name = stack.pop()
            if name in seen or name not in defs:
                continue
            seen.add(name)
            inner, inner_rest = defs[name]
            yield name, inner, inner_rest
            if inner in _THROUGH:
                stack.extend(_operands(inner_rest))


def narrow_index_products(ir: str) -> list[str]:
    """The 32-bit (``i32``) multiplications in ``ir`` that feed a pointer offset
    (``tt.addptr``) and take a value derived from a load (a row index read from memory),
    as IR lines: each is an ``index * stride`` that wraps on a table of 2^31 elements."""
    defs = _definitions(ir)

    def loaded(name: str, seen: set[str]) -> bool:
        if name in seen or name not in defs:
            return False
        seen.add(name)
        op, rest = defs[name]
        return op == "tt.load" or (op in _THROUGH and any(loaded(o, seen) for o in _operands(rest)))

    found = []
    for name, op, rest in _offset_producers(defs):
        narrow = rest.split(" : ")[-1].strip().endswith(("xi32>", "i32"))
        if op == "arith.muli" and narrow and any(loaded(o, set()) for o in _operands(rest)):
            found.append(f"{name} = {op} {rest.strip()}")
    return found


def narrow_program_products(ir: str, programs: int) -> list[str]:
    """The 32-bit multiplications in ``ir`` of the program id along the grid's first axis
    by a constant that feed a pointer offset and wrap on a launch of ``programs``
    programs along it (the last program's product past 2^31 - 1), as IR lines."""
    defs = _definitions(ir)
    constants = {name: int(rest.split(" : ")[0]) for name, (op, rest) in defs.items()
                 if op == "arith.constant" and re.fullmatch(r"-?\d+ : i32", rest.strip())}
    found = []
    for name, op, rest in _offset_producers(defs):
        if op == "arith.muli" and rest.split(" : ")[-1].strip() == "i32":
            args = _operands(rest)
            ids = [a for a in args if defs.get(a, ("", ""))[0] == "tt.get_program_id" and defs[a][1].startswith("x")]
            factor = [constants[a] for a in args if a in constants]
            if ids and factor and (programs - 1) * factor[0] > 2**31 - 1:
                found.append(f"{name} = {op} {rest.strip()}")
    return found


def kernel_signature(kernel, pointers: dict[str, str], sizes: tuple[str, ...]) -> dict[str, str]:
    """A signature for ``kernel``'s arguments (a ``triton.jit`` function, or the
    interpreter's wrapper of one): ``pointers`` their types (``*fp32``...), ``sizes``
    int32, every other argument constexpr."""
    names = inspect.signature(kernel.fn).parameters
    return {name: pointers.get(name, "i32" if name in sizes else "constexpr") for name in names}


# Index arrays of the generated kernels (backend/triton/codegen.py), by parameter name;
# every other pointer is a table of ``data``
_INDEX_POINTERS = {"rowptr", "col", "eid", "seg_row", "seg_start", "seg_end", "seg_slot", "slot_segments", "src",
                   "dst", "rows", "degree", "merge_row", "slot_ptr", "etype", "arrived"}
_SIZES = ("num_segments", "num_edges", "size_class", "split_segments", "out_numel")


def generated_signature(kernel, data: str = "*fp32") -> dict[str, str]:
    """A signature for a generated kernel's arguments: int32 index arrays (the graph's
    narrowest), ``data`` tables, int32 sizes, its annotated constexprs."""
    signature = {}
    for name, param in inspect.signature(kernel.fn).parameters.items():
        if "constexpr" in str(param.annotation):
            signature[name] = "constexpr"
        elif name in _SIZES:
            signature[name] = "i32"
        else:
            signature[name] = "*i8" if name == "seg_split" else "*i32" if name in _INDEX_POINTERS else data
    return signature
