"""What Triton's CPU interpreter cannot run: bfloat16.

The interpreter (``TRITON_INTERPRET=1``, how CI and CPU-only machines run the Triton
backend) computes every kernel in numpy, which has no bfloat16: a generated kernel
reading or writing bfloat16 stopped deep inside Triton with ``InterpreterError:
ValueError('Unsupported data type')``. Such a program runs on the torch reference backend
instead, with one warning, and computes the same values. Compiled kernels on a GPU read
bfloat16, so only the interpreter is refused it, never the dtype as such.
"""
from __future__ import annotations

from ..environ import getenv
from ..user_warning import warn

_WARNED: list[bool] = []


def interpreter_lacks_bfloat16() -> bool:
    """Whether the Triton backend runs in the interpreter now (read at call time, as
    `compiled._check_triton_can_read` reads it), warning the first time it is asked:
    the caller then runs its bfloat16 program on the torch reference backend."""
    if getenv("TRITON_INTERPRET") != "1":
        return False
    if not _WARNED:
        _WARNED.append(True)
        warn("gnnfuse triton backend: Triton's CPU interpreter (TRITON_INTERPRET=1) has no bfloat16; "
             "programs with bfloat16 values run on the torch reference backend", RuntimeWarning)
    return True
