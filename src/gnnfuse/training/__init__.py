"""Node-classification training: configs, data preparation, the training loop, checkpoints;
and training steps replayed from a CUDA graph on padded batches of blocks or of whole graphs
(`BlockStepCapture`, `GraphStepCapture`).

`make_config` + `train_runs` are what ``gnnfuse train`` and ``benchmarks/accuracy.py`` run.
"""
from .captured_step import BlockStepCapture, GraphStepCapture
from .checkpoint import CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from .config import ConfigError, TrainConfig, make_config
from .data import SPARSE_FEATURES, PreparedData, prepare_data
from .loop import (EarlyStopping, RunResult, TrainingInterrupted, TrainSummary, accuracy, peak_memory_mib, train_run,
                   train_runs)

__all__ = ["BlockStepCapture", "GraphStepCapture", "CHECKPOINT_FORMAT", "ConfigError", "EarlyStopping", "PreparedData", "RunResult", "SPARSE_FEATURES",
           "TrainConfig", "TrainingInterrupted", "TrainSummary", "accuracy", "load_checkpoint", "make_config", "peak_memory_mib",
           "prepare_data", "save_checkpoint", "train_run", "train_runs"]
