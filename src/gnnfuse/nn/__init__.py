"""Neural-network layers with PyG's names and parameter layout (`conv`), plain-PyTorch
baselines (`reference`) that the compiled layers are measured against, and a registry of
standard node-classification models built from them (`models`)."""
from .conv import GATConv, GCNConv, SAGEConv
from .models import Hyperparameters, ModelSpec, build_model, get_model, model_names
from .reference import GCN, gcn_norm

__all__ = ["GATConv", "GCNConv", "GCN", "Hyperparameters", "ModelSpec", "SAGEConv", "build_model", "gcn_norm",
           "get_model", "model_names"]
