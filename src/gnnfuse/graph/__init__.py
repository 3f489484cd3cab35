"""Graph storage: an immutable edge list plus lazily built, cached kernel layouts."""
from .graph import CSR, Graph, GraphModifiedError
from .hetero import HeteroGraph
from .in_edges import in_edges_block
from .index_cache import clear_index_cache
from .validate import choose_index_dtype

__all__ = ["CSR", "Graph", "GraphModifiedError", "HeteroGraph", "choose_index_dtype", "clear_index_cache", "in_edges_block"]
