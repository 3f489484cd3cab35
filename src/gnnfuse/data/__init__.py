"""Data sets: real graphs read in place (or downloaded when missing), and seeded synthetic ones."""
from .dataset import DataFileError, NodeDataset, RelationalDataset, random_split, row_normalize
from .download import DownloadError
from .npz import load_npz
from .paths import ROOT_HELP, candidate_roots, download_root, find_data_file, find_data_folder, user_cache_dir
from .planetoid import load_planetoid
from .registry import (DATASET_NAMES, DEFAULT_DATASET, LOAD_ERRORS, POWER_LAW_PRESETS, check_node_dataset_name,
                       load_dataset, load_node_dataset)
from .synthetic import planted_partition, power_law_graph
from .wn18rr import load_wn18rr

__all__ = [
    "DATASET_NAMES", "DEFAULT_DATASET", "DataFileError", "DownloadError", "LOAD_ERRORS", "NodeDataset",
    "POWER_LAW_PRESETS", "ROOT_HELP", "RelationalDataset", "candidate_roots", "check_node_dataset_name",
    "download_root", "find_data_file",
    "find_data_folder", "load_dataset", "load_node_dataset", "load_npz", "load_planetoid", "load_wn18rr",
    "planted_partition", "power_law_graph", "random_split", "row_normalize", "user_cache_dir",
]
