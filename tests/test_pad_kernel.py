"""`loader.static_shapes.pad_block`'s one-kernel Triton version against its torch path,
under Triton's interpreter on a CPU and on the GPU on a GPU machine (its own module: the
suite's tripwire, test_suite_devices.py, reads a module naming the Triton engine as one
that may force the Triton backend)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given

from gnnfuse.loader.static_shapes import pad_block
from test_static_shapes import RUNS, padded_hops

pytest.importorskip("triton")


@RUNS
@given(padded_hops())
def test_the_padding_kernel_writes_the_torch_paths_arrays(drawn):
    hop, (spare_src, spare_dst, extra) = drawn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hop = type(hop)(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in hop))
    sizes = (hop.nodes.numel() + spare_src, hop.rowptr.numel() - 1 + spare_dst, hop.local_src.numel() + extra)
    by_torch, by_kernel = pad_block(hop, *sizes, engine="torch"), pad_block(hop, *sizes, engine="triton")
    for a, b in zip(by_torch, by_kernel):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
