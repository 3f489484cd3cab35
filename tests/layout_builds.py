"""What a step builds per graph: the keys `Graph.cached` computes (not finds) while watched.

A loader builds its batches' layouts ahead (`loader.layouts`); a step that builds one
itself does host work on the critical path. Tests watch a step on a fresh batch and
allow only the few per-graph values the loader leaves to the step (`STEP_BUILDS`)."""
from __future__ import annotations

import gnnfuse

# The reference executor's per-graph values (a mean's clamped degrees), GAT's
# partial-maxima slots of split rows (one small allocation without a split row) and a
# scan's rows in CSR order (one repeat_interleave of known size): sync-free and cheap,
# read by few layers, so the loader leaves them to the step.
STEP_BUILDS = ("reference_per_graph:", "triton_partial_slots_", "rows_in_")


def watch_builds(monkeypatch) -> list[str]:
    """The list `Graph.cached` appends each key it builds to, from now on (``monkeypatch``'s)."""
    built: list[str] = []
    cached = gnnfuse.Graph.cached

    def watched(self, key, fn):
        if key not in self._cache:
            built.append(key)
        return cached(self, key, fn)
    monkeypatch.setattr(gnnfuse.Graph, "cached", watched)
    return built
