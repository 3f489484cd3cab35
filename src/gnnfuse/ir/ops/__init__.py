"""Importing this package registers every built-in op."""
from . import (dense, elementwise, features, indexed_matmul, indexing, movement, pairwise,  # noqa: F401
               positional, row_matmul, select, typed)
