"""The tuner (`gnnfuse tune`): FeatGraph's grid search over the backends' schedule
spaces, per fused unit, with the choices stored where the backends look them up
(backend/tuned_schedule.py)."""
from .search import TunedUnit, tune
from .space import SPACES, candidates

__all__ = ["SPACES", "TunedUnit", "candidates", "tune"]
