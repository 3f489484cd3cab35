"""Importing this package registers every built-in op."""
from . import dense, elementwise, movement, typed  # noqa: F401
