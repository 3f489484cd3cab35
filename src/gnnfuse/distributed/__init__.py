"""Training on several processes through torch.distributed (issue #17): NCCL between
GPUs, gloo between CPU processes; launched by ``torchrun -m gnnfuse train`` or
``gnnfuse train --gpus N`` / ``--cpu-ranks N``.

Data-parallel mini-batch training (`minibatch`) gives each rank a disjoint share of the
training seeds and averages gradients with ``DistributedDataParallel`` (or, in a step
replayed from a CUDA graph, with `average_gradients`, one all-reduce the graph holds); features are
replicated or partitioned across ranks (`features`). Full-graph training partitions the
vertices across ranks (`fullgraph`, `partition`, `halo`). `dispatch` picks which a rank
runs; `launch` and `process_group` start and join the ranks. Importing this package
starts nothing.
"""
from .features import PartitionedFeatures, row_ranges
from .gradients import average_gradients, broadcast_parameters
from .dispatch import train_run_function
from .launch import launch_or_join
from .process_group import DistributedError, Rank, current, init_process_group, world_size

__all__ = ["DistributedError", "PartitionedFeatures", "Rank", "average_gradients", "broadcast_parameters", "current",
           "init_process_group", "launch_or_join", "row_ranges", "train_run_function", "world_size"]
