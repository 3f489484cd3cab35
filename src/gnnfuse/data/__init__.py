"""Data sets: real graphs read in place from the shared data folder, and seeded synthetic ones."""
from .dataset import NodeDataset, RelationalDataset, random_split, row_normalize
from .npz import load_npz
from .paths import candidate_roots, find_data_file
from .planetoid import load_planetoid
from .registry import DATASET_NAMES, DEFAULT_DATASET, POWER_LAW_PRESETS, load_dataset, load_node_dataset
from .synthetic import planted_partition, power_law_graph
from .wn18rr import load_wn18rr

__all__ = [
    "DATASET_NAMES", "DEFAULT_DATASET", "NodeDataset", "POWER_LAW_PRESETS", "RelationalDataset",
    "candidate_roots", "find_data_file", "load_dataset", "load_node_dataset", "load_npz", "load_planetoid", "load_wn18rr",
    "planted_partition", "power_law_graph", "random_split", "row_normalize",
]
