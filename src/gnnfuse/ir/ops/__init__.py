"""Importing this package registers every built-in op."""
from . import dense, elementwise, features, indexed_matmul, indexing, movement, row_matmul, typed  # noqa: F401
