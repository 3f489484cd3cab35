"""Full-graph training step, gnnfuse against PyG (eager and torch.compile'd), in one process.

`run_bench` loads a data set once, builds the same two-layer model from gnnfuse's and
PyG's layers with one set of initial weights, checks that their eval-mode forwards agree,
then times training steps (forward, loss on the training nodes, backward, Adam) for each
framework. A framework that fails (torch.compile on an unsupported set-up, OOM) gets a
status instead of a time; the run goes on. The ``gnnfuse bench`` command and
benchmarks/bench_training.py (the multi-data-set, results-merging driver) both use this
module, so models, timing and memory accounting have one implementation.

PyG is the outside oracle here, not a dependency of gnnfuse: ``pip install 'gnnfuse[bench]'``.
"""
from .command import add_arguments, run_command
from .compare import format_table, plot, ratios, run_bench
from .measure import COMPILE_EXTRA_WARMUP, REL_ERR_LIMIT, CellTimeout, check_forward, guarded, max_rel_err, measure
from .models import (DROPOUT, FRAMEWORKS, GAT_HEADS, GAT_HIDDEN, HIDDEN, KNOWN_FRAMEWORKS, LR, MODELS, WEIGHT_DECAY,
                     DeviceData, MissingDependency, TwoLayer, build_model, graph_input, instantiate, load_data, reference_state,
                     require_pyg)
from .timing import (allocated_gb, extra_peak_gb, failure_status, free_memory, peak_memory_gb, reset_peak_memory,
                     summarize, synchronize, time_calls)

__all__ = ["COMPILE_EXTRA_WARMUP", "DROPOUT", "FRAMEWORKS", "GAT_HEADS", "GAT_HIDDEN", "HIDDEN", "KNOWN_FRAMEWORKS",
           "LR", "MODELS", "REL_ERR_LIMIT", "WEIGHT_DECAY", "CellTimeout", "DeviceData", "MissingDependency", "TwoLayer",
           "add_arguments", "allocated_gb", "build_model", "check_forward", "extra_peak_gb", "failure_status", "format_table",
           "free_memory", "graph_input", "guarded", "instantiate", "load_data", "max_rel_err", "measure",
           "peak_memory_gb", "plot", "ratios", "reference_state", "require_pyg", "reset_peak_memory", "run_bench",
           "run_command", "summarize", "synchronize", "time_calls"]
