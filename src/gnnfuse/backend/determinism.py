"""``torch.use_deterministic_algorithms`` for gnnfuse's own kernels.

Torch users who ask for determinism get, from torch, either an operation that gives the
same bits on every run or an error naming the operation that cannot (a warning with
``warn_only=True``). gnnfuse's Triton kernels are not torch operations, so torch's switch
never reached them: split hub rows, the edge-parallel (COO), ``rows`` and ``scan``
schedules, the relation-typed row scatter, the typed weight gradient and the selected-row
cross-entropy's gradient add floats atomically, whose order (and so whose last bits)
changes from run to run; and the autotuner picks block sizes by timing, which changes
the order of additions within a row between processes. With the switch on, the Triton
backend still splits hub rows, but their segments meet in a fixed order
(`triton.executor.ordered_splits`: each segment's partial sum in a slot of its own,
summed from the first by the row's last segment or by a merge kernel), takes the CSR
walk (or the torch form, whose determinism is torch's business) instead of an atomic
schedule, sums the typed row scatter per target row in a sorted order
(`triton.scatter_rows.target_order`), and launches its fixed block sizes; a schedule
the caller forces that adds atomically is refused as torch refuses its own
nondeterministic operations. The reference and CPU backends add in a
fixed order already.
"""
from __future__ import annotations

import torch

from ..user_warning import warn

# torch's own getters behind ``torch.are_deterministic_algorithms_enabled`` and
# ``is_deterministic_algorithms_warn_only_enabled``: every program run compares them with
# the settings its launch plans were made under, and the public wrappers took 0.44 us a
# pair on the 2-core CI machine against 0.11
_ENABLED, _WARN_ONLY = torch._C._get_deterministic_algorithms, torch._C._get_deterministic_algorithms_warn_only


def state() -> tuple[bool, bool]:
    """What a launch plan depends on: whether determinism is on, and whether a breach of
    it only warns."""
    return _ENABLED(), _WARN_ONLY()


def deterministic() -> bool:
    """Whether ``torch.use_deterministic_algorithms(True)`` is in force."""
    return _ENABLED()


def alert_not_deterministic(what: str, instead: str) -> None:
    """As torch does for its own operations: under ``use_deterministic_algorithms(True)``
    raise a RuntimeError saying that ``what`` has no deterministic implementation (and
    ``instead``, what would run deterministically), or only warn under ``warn_only=True``;
    nothing when determinism is off."""
    if not _ENABLED():
        return
    message = (f"{what} does not have a deterministic implementation, but you set "
               f"'torch.use_deterministic_algorithms(True)'. {instead}, or use the 'warn_only=True' option "
               "if nondeterminism is acceptable for your application.")
    if _WARN_ONLY():
        warn(message, UserWarning)
        return
    raise RuntimeError(message)
