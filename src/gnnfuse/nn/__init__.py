"""Neural-network layers with PyG's names and parameter layout (`conv`, `attention`), and plain-PyTorch
baselines (`reference`) that the compiled layers are measured against."""
from .attention import CGATConv, DotGATConv, EdgeConv, GATv2Conv, MLPAggConv, NGCFConv
from .conv import GATConv, GCNConv, SAGEConv
from .reference import GCN, gcn_norm

__all__ = ["CGATConv", "DotGATConv", "EdgeConv", "GATConv", "GATv2Conv", "GCNConv", "GCN", "MLPAggConv",
           "NGCFConv", "SAGEConv", "gcn_norm"]
