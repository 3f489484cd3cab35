"""What each rank of a multi-process ``gnnfuse train`` runs: `train_run_function`."""
from __future__ import annotations

from typing import Callable

from ..training.config import TrainConfig
from .process_group import world_size


def train_run_function(config: TrainConfig) -> Callable[..., object] | None:
    """What each rank runs when there are several (None with one process): data-parallel
    mini-batch training with a fanout, partitioned full-graph training without."""
    if world_size() == 1:
        return None
    if config.fanout is None:
        from .fullgraph import train_full_graph_run       # gnnfuse.distributed.fullgraph (item 2 of #17)
        return train_full_graph_run
    from .minibatch import train_distributed_minibatch_run
    return train_distributed_minibatch_run
