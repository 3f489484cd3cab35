"""Neural-network layers. `reference` holds plain-PyTorch baselines (gather/index_add)
that the compiled layers are measured against."""
from .reference import GCN, gcn_norm

__all__ = ["GCN", "gcn_norm"]
