"""Ways to write a layer: vertex-centric functions and DGL-style message/reduce UDFs."""
from .compiled_call import udf_factory
from .message import UpdateAll, apply_edges, message_passing, trace_message_passing
from .vertex import VertexFunction, compile, vertex

__all__ = ["UpdateAll", "VertexFunction", "apply_edges", "compile", "message_passing", "trace_message_passing",
           "udf_factory", "vertex"]
