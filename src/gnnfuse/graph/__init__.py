"""Graph storage: an immutable edge list plus lazily built, cached kernel layouts."""
from .graph import CSR, Graph
from .validate import choose_index_dtype

__all__ = ["CSR", "Graph", "choose_index_dtype"]
