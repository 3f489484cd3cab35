"""Kernel-level templates: FeatGraph's generalized SpMM and SDDMM with user functions
(see `gnnfuse.frontend.templates`)."""
from .frontend.templates import Schedule, gsddmm, gspmm

__all__ = ["Schedule", "gsddmm", "gspmm"]
