"""PyG's ``aggr_module`` on layers that fuse the aggregation they were built with.

PyG's ``MessagePassing.aggregate`` calls ``self.aggr_module`` on every call, so PyG code may
replace it after construction (``conv.aggr_module = MaxAggregation()``) and PyG's layer then
aggregates with the new module. gnnfuse's layers other than SAGEConv (which runs its
``aggr_module`` as PyG's does) fuse their reduction into their kernels and have no such
attribute: torch stored the assigned module as a new submodule that nothing read, so the
layer silently kept its own reduction (GraphConv, GINConv and EdgeConv 0.5-1.1 off PyG's
outputs).
"""
from __future__ import annotations

from typing import Any


class FixedAggregation:
    """Mixin placed before ``nn.Module``: assigning ``aggr_module`` raises, naming the layer,
    where PyG's namesake would aggregate with it (``_pyg_reads_aggr_module``)."""

    _pyg_reads_aggr_module = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "aggr_module" and self._pyg_reads_aggr_module:
            layer = type(self).__name__
            raise AttributeError(f"{layer} fuses the aggregation it was built with into its kernels and has no "
                                 f"aggr_module: one assigned here (PyG's {layer} would aggregate with it) would be "
                                 "ignored. Build the layer with the aggregation it takes, or use SAGEConv, which "
                                 "runs any PyG aggregation module")
        super().__setattr__(name, value)
