"""Neural-network layers with PyG's names and parameter layout (`conv`), and plain-PyTorch
baselines (`reference`) that the compiled layers are measured against."""
from .conv import GATConv, GCNConv, SAGEConv
from .reference import GCN, gcn_norm

__all__ = ["GATConv", "GCNConv", "GCN", "SAGEConv", "gcn_norm"]
