"""A data set loaded, split and moved to the training device, in the layout models take."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data import LOAD_ERRORS, load_node_dataset, random_split
from ..graph import Graph
from ..nn.models import ModelSpec
from .config import ConfigError, TrainConfig

SPARSE_FEATURES = 0.1      # feature matrices with fewer non-zeros than this go in as sparse COO


@dataclass(frozen=True)
class PreparedData:
    """A data set moved to the device, with features in the layout the model takes."""
    name: str
    graph: Graph
    x: torch.Tensor
    y: torch.Tensor
    masks: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    num_features: int
    num_classes: int


def prepare_data(config: TrainConfig, spec: ModelSpec) -> PreparedData:
    """Load the data set, split it if it has no split (seeded by `config.seed`, the same
    for every run), and move it to the device; `ConfigError` if that cannot be done."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device cuda, but CUDA is not available to this torch ({torch.__version__})")
    device = torch.device(config.device)
    try:
        dataset = load_node_dataset(config.dataset, config.root)
    except LOAD_ERRORS as error:
        raise ConfigError(str(error)) from None
    if config.fanout is not None and dataset.graph.edge_type is not None:
        # the loader refuses it, but only once a run starts, as a traceback
        raise ConfigError(f"--fanout samples mini-batches of a homogeneous graph, and {config.dataset}'s edges are "
                          f"typed ({dataset.graph.num_edge_types} relations): train it on the full graph "
                          "(without --fanout)")
    if dataset.train_mask is None:
        dataset = random_split(dataset, seed=config.seed)
        print(f"{dataset.name} has no split: using random_split(seed={config.seed})")
    from ..distributed import world_size        # distributed builds on training: imported on use
    # Features split across several ranks -- partitioned for mini-batches, and always for
    # the partitioned full graph (no fanout): each rank moves only its own rows to its
    # device (gnnfuse.distributed.minibatch, .fullgraph), so the whole table stays in host
    # memory here.
    split = config.features == "partitioned" or config.fanout is None
    x = dataset.x if split and world_size() > 1 else dataset.x.to(device)
    if spec.sparse_input and x.count_nonzero() < SPARSE_FEATURES * x.numel():
        # bag-of-words features (cora: 1.3% non-zero): dropout and the first matmul then
        # touch only the non-zeros, ~8x less work in what dominated a dense cora epoch
        x = x.to_sparse()
    masks = tuple(m.to(device) for m in (dataset.train_mask, dataset.val_mask, dataset.test_mask))
    return PreparedData(dataset.name, dataset.graph.to(device), x, dataset.y.to(device), masks,
                        dataset.num_features, dataset.num_classes)
