"""The default optimization pipeline run on every compiled program."""
from __future__ import annotations

from ..ir import Program, verify
from .addmm import fold_product_adds
from .compact import materialize_compactly
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .distribute_products import distribute_products
from .fold import fold_constants
from .linear_reorder import reorder_typed_linear
from .narrow_products import narrow_products
from .pairwise import sort_hinge_pairs
from .reorder import reorder_broadcasts
from .row_dot import fuse_row_dots
from .softmax import decompose_edge_softmax, stop_softmax_shift_gradients
from .typed_root import fold_typed_root


def optimize(program: Program, keep_inputs: bool = False) -> Program:
    decompose_edge_softmax(program)
    stop_softmax_shift_gradients(program)
    sort_hinge_pairs(program)
    fold_constants(program)
    distribute_products(program)
    reorder_broadcasts(program)
    materialize_compactly(program)
    reorder_typed_linear(program)
    fold_typed_root(program)
    eliminate_common_subexpressions(program)
    # Again: a softmax written out by hand repeats its ``exp(x - max)`` in the sum and in
    # each numerator, and only once CSE has merged them is every use of the one ``exp``
    # seen to be normalized (`stop_softmax_shift_gradients`).
    stop_softmax_shift_gradients(program)
    fuse_row_dots(program)
    narrow_products(program)
    fold_product_adds(program)
    eliminate_dead_code(program, keep_inputs=keep_inputs)
    verify(program)
    return program
