"""Program rewrites: each pass takes a program, rewrites it in place and returns it."""
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .fold import fold_constants
from .pipeline import optimize
from .reorder import reorder_broadcasts

__all__ = ["eliminate_common_subexpressions", "eliminate_dead_code", "fold_constants", "optimize",
           "reorder_broadcasts"]
