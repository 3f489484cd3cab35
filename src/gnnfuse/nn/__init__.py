"""Neural-network layers with PyG's names and parameter layout (`conv`: GCN, GraphSAGE,
GAT; `propagation`: GIN, GraphConv, APPNP, SGC, TAG, Chebyshev), and plain-PyTorch
baselines (`reference`) that the compiled layers are measured against."""
from .conv import GATConv, GCNConv, SAGEConv
from .propagation import APPNP, ChebConv, GINConv, GraphConv, SGConv, TAGConv
from .reference import GCN, gcn_norm

__all__ = ["APPNP", "ChebConv", "GATConv", "GCNConv", "GCN", "GINConv", "GraphConv", "SAGEConv", "SGConv",
           "TAGConv", "gcn_norm"]
