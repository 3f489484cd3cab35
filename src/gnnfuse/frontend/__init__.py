"""Ways to write a layer: vertex-centric functions and DGL-style message/reduce UDFs."""
from .message import apply_edges, message_passing, trace_message_passing
from .vertex import VertexFunction, compile, vertex

__all__ = ["VertexFunction", "apply_edges", "compile", "message_passing", "trace_message_passing", "vertex"]
