"""Ways to write a layer: vertex-centric functions and DGL-style message/reduce UDFs."""
from .compiled_call import udf_factory
from .message import UpdateAll, apply_edges, message_passing, trace_message_passing
from .vertex import VertexFunction, as_table_rows, compile, vertex

__all__ = ["UpdateAll", "VertexFunction", "apply_edges", "as_table_rows", "compile", "message_passing",
           "trace_message_passing", "udf_factory", "vertex"]
