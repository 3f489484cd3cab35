"""Padded mini-batches on the Triton backend (the Triton interpreter on the CPU, CUDA on a
GPU machine): whatever the executor reads of a padded block comes with the batch, so a
captured step adds nothing to a block's graph cache and replays. Kept apart from
test_static_shapes.py, whose other tests parametrize the reference and CPU backends."""
from __future__ import annotations

import torch

from gnnfuse.backend.triton.schedule import SEGMENT_EDGES
from oracle_check import device_for
from test_static_shapes import _loader, _training, data  # noqa: F401 - data is a fixture


def test_steps_on_the_triton_backend_cache_nothing_on_padded_blocks_and_replay(data, monkeypatch):
    """Whatever the Triton executor reads of a padded block (segments, split-row slots)
    is built by the loader (`loader.layouts`); one key the step adds itself drops the
    capture (a split-row slot table once did, on every GPU run). Device: the Triton
    interpreter on the CPU; on a GPU machine the recorder stands in for the graph all the same.
    (GAT's steps take minutes under the interpreter: its tables are checked below.)"""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    device = device_for("triton")
    eager, eager_params, _ = _training(data, False, batches=6, device=device)
    replayed, params, run = _training(data, True, deferred=True, batches=6, device=device)
    assert run.status == "captured" and run.replayed == 3
    torch.testing.assert_close(torch.tensor(replayed), torch.tensor(eager), rtol=1e-9, atol=1e-12)
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_the_loader_builds_every_split_row_table_of_a_padded_blocks_whole_row_segments(data, monkeypatch):
    """The tables GAT's merge kernels (`partial_slots`) and the sums' split rows
    (`split_slots`) read, on both sides, come with the padded batch: none left for a step."""
    monkeypatch.setenv("GNNFUSE_BACKEND", "triton")
    batch = next(iter(_loader(data, static_shapes=True, device=device_for("triton"))))
    for block in batch.blocks:
        keys = set(block.graph._cache)
        for table in ("segments", "split_slots", "partial_slots"):
            assert {f"triton_{table}_{by}_{SEGMENT_EDGES}" for by in ("dst", "src")} <= keys, (table, keys)
