"""gnnfuse: write GNN layers the way the maths reads, run them as fused kernels.

Layering (each imports only from those before it): graph -> ir -> passes -> autodiff ->
backend -> runtime -> frontend -> nn / data / cli.
"""
from .frontend import apply_edges, compile, message_passing, vertex
from .graph import Graph, HeteroGraph
from .ir import CompileError
from .runtime import explain
from . import napa, ops   # kernel-level templates (FeatGraph) and NAPA primitives (GraphTensor)

__version__ = "0.1.0"
__all__ = ["CompileError", "Graph", "HeteroGraph", "apply_edges", "compile", "explain", "message_passing", "vertex", "__version__"]
