"""PyG's ``flow`` attribute on layers that send messages one way only.

PyG's ``MessagePassing`` reads ``self.flow`` on every call, so PyG code may set
``conv.flow = "target_to_source"`` after construction. gnnfuse's GCNConv follows it;
the other layers take no ``flow`` argument, and an assigned attribute was silently
ignored (SAGE, GraphConv, GAT, GIN kept sending source -> target: up to 1.1 off PyG).
"""
from __future__ import annotations

SOURCE_TO_TARGET = "source_to_target"


class FixedFlow:
    """Mixin placed before ``nn.Module``: ``flow`` reads as PyG's default, and setting it
    to anything else raises, naming the layer."""

    @property
    def flow(self) -> str:
        return SOURCE_TO_TARGET

    @flow.setter
    def flow(self, value: str) -> None:
        if value != SOURCE_TO_TARGET:
            raise AttributeError(f"{type(self).__name__} sends messages source -> target only (gnnfuse's GCNConv "
                                 f"follows flow); setting flow={value!r} would be ignored")
