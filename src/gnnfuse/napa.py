"""GraphTensor's NAPA primitives: NeighborApply (edge weighting), Pull (aggregation) and
Apply (combination); see `gnnfuse.frontend.napa`."""
from .frontend.napa import Apply, NeighborApply, Pull

__all__ = ["Apply", "NeighborApply", "Pull"]
