"""Importing this package registers every built-in op."""
from . import (compact, dense, elementwise, features, indexed_matmul, indexing, movement, pairwise,  # noqa: F401
               positional, row_matmul, select, typed, typed_aggregate)
