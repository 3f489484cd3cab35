"""Program rewrites: each pass takes a program, rewrites it in place and returns it."""
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .fold import fold_constants
from .pairwise import sort_hinge_pairs
from .pipeline import optimize
from .reorder import reorder_broadcasts
from .softmax import decompose_edge_softmax

__all__ = ["decompose_edge_softmax", "eliminate_common_subexpressions", "eliminate_dead_code", "fold_constants", "optimize",
           "reorder_broadcasts", "sort_hinge_pairs"]
