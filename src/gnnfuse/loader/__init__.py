"""Mini-batch loading for graphs that do not fit (or need not run) whole: neighbour
sampling into per-layer blocks, with a pipelined prefetch (GraphTensor §V-B); and PyG's
``DataLoader`` for batches of whole graphs, optionally padded to fixed shapes
(`data_loader`, `padded_graph_batch`)."""
from .block import Block, block_graph
from .batch_maker import MiniBatch
from .hetero_loader import HeteroNeighborLoader
from .link_batch import LinkMiniBatch
from .link_loader import LinkNeighborLoader, NegativeSampling
from .neighbor_loader import FEATURE_DEVICES, NeighborLoader
from .padded_graph_batch import GraphCapacities
from .sampler import Reindexed, SampledBlock, SampledHop, reindex, sample_block, sample_hop
from .stages import STAGES, StageTimes
from .static_shapes import IGNORE_LABEL, Capacities

__all__ = ["Block", "Capacities", "DataLoader", "FEATURE_DEVICES", "GraphCapacities", "HeteroNeighborLoader", "IGNORE_LABEL", "LinkMiniBatch",
           "LinkNeighborLoader", "MiniBatch", "NegativeSampling", "NeighborLoader", "Reindexed", "STAGES",
           "SampledBlock", "SampledHop", "StageTimes", "block_graph", "reindex", "sample_block", "sample_hop"]


def __getattr__(name: str):
    # PyG's DataLoader is what `DataLoader` extends, and PyG stays optional: importing it
    # is deferred to first use (where a missing torch_geometric raises its ImportError)
    if name == "DataLoader":
        from .data_loader import DataLoader
        return DataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
