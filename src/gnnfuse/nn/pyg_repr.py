"""PyG's one-line printed form of a layer.

PyG prints a convolution as its class and its defining arguments (``GCNConv(16, 32)``,
``GATConv(8, 32, heads=2)``, ``GINConv(nn=...)``) rather than torch's tree of child
modules; users and PyG's own tests compare that text, so a switched import prints the same.
"""
from __future__ import annotations


class OneLineRepr:
    """Mixin placed before ``nn.Module``: ``repr(layer)`` is ``Name(<extra_repr()>)``.

    Each layer's ``extra_repr`` returns PyG's argument text; by default the channel pair
    ``in_channels, out_channels``, as PyG's ``MessagePassing.__repr__`` prints.
    """

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"
