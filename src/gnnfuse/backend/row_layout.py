"""The row stride at which generated GPU kernels read a vertex table.

A kernel gathers whole vertex rows. At a width that is not a multiple of four floats
(41 or 47 classes, say) no gathered row is 16-byte aligned, every load is scalar, and a
GCN unit at width 41 ran 2x slower than at width 64 on an H100. So such tables are read
at a stride rounded up to four elements: the executor pads a copy, or -- better -- the
layer that makes the table writes it that way in the first place (`gnnfuse.nn`'s linear
maps do on CUDA), and the executor passes such a view through untouched.
"""
from __future__ import annotations

VECTOR = 4   # float32 elements per 16-byte vector load


def aligned_row_width(width: int) -> int:
    """Elements between rows of a ``width``-element vertex table as kernels read it:
    ``width`` itself when it is at most one vector or a whole number of vectors, else
    rounded up to the next whole vector."""
    if width <= VECTOR or width % VECTOR == 0:
        return width
    return -(-width // VECTOR) * VECTOR


def has_row_stride(tensor, width: int, stride: int) -> bool:
    """Whether `tensor` (rows of ``width`` elements) already has its rows ``stride``
    elements apart, each row contiguous, and its storage reaches the last row's padding
    lanes (kernels load them, then mask them off): the layout a kernel reads, with no
    copy."""
    if tensor.dim() < 1 or tensor.shape[0] < 1 or tensor.numel() != tensor.shape[0] * width:
        return False
    room = tensor.untyped_storage().nbytes() // tensor.element_size() - tensor.storage_offset()
    if room < tensor.shape[0] * stride:
        return False
    if tensor.shape[0] > 1 and tensor.stride(0) != stride:
        return False
    expected = 1
    for size, step in zip(reversed(tensor.shape[1:]), reversed(tensor.stride()[1:])):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True
