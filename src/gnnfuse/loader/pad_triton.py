"""`static_shapes.pad_block` as one Triton kernel, for blocks on a GPU.

The torch version builds a padded block from about 27 small ops (aranges, divisions,
casts, concatenations); in the loader's thread each costs a launch and its Python, and
a padded products-sized batch has three blocks. This kernel writes the six padded arrays
in one launch, each entry either copied from the real block or computed by the same
formulas (see `static_shapes.pad_block`; the tests check both give the same arrays).

Imported only when a block is padded on a GPU (or under Triton's interpreter in the
tests).
"""
import triton
import triton.language as tl

BLOCK = 1024


# The counts change with every batch; specialized on them, Triton would compile a variant
# per count that is 1 or a multiple of 16 (see `hop_triton`).
@triton.jit(do_not_specialize=["real_dst", "real_edges", "real_src", "real_unread", "num_dst", "num_edges",
                               "num_src"])
def pad_block(rowptr, local_src, dst, out_degrees, nodes, unread,
              rowptr_out, local_src_out, dst_out, out_degrees_out, nodes_out, unread_out,
              real_dst, real_edges, real_src, real_unread, num_dst, num_edges, num_src, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    real_dst, real_edges, real_src = real_dst.to(tl.int64), real_edges.to(tl.int64), real_src.to(tl.int64)
    num_dst, num_edges, num_src = num_dst.to(tl.int64), num_edges.to(tl.int64), num_src.to(tl.int64)
    extra, spare_dst, spare_src = num_edges - real_edges, num_dst - real_dst, num_src - real_src
    # edges: the real ones, then padded source -> padded destination, in destination order
    edge = i < num_edges
    real = i < real_edges
    k = i - real_edges
    src = tl.where(real, tl.load(local_src + i, mask=real, other=0), real_src + k % spare_src)
    to = tl.where(real, tl.load(dst + i, mask=real, other=0), real_dst + (k * spare_dst) // tl.maximum(extra, 1))
    tl.store(local_src_out + i, src, mask=edge)
    tl.store(dst_out + i, to, mask=edge)
    # row pointers: the real rows, then the padded rows' share of the padded edges
    inside = i < real_dst
    j = i - real_dst
    ptr = tl.where(inside, tl.load(rowptr + i, mask=inside, other=0), real_edges + (j * extra + spare_dst - 1) // spare_dst)
    tl.store(rowptr_out + i, ptr, mask=i < num_dst + 1)
    # sources: out-degrees (a padded source's padded edges) and global ids (0 for padding)
    source = i < real_src
    m = i - real_src
    degree = tl.where(source, tl.load(out_degrees + i, mask=source, other=0), (extra - m + spare_src - 1) // spare_src)
    tl.store(out_degrees_out + i, degree, mask=i < num_src)
    tl.store(nodes_out + i, tl.load(nodes + i, mask=source, other=0), mask=i < num_src)
    # the rows a combine-first layer skips: the real ones, then the last padded source
    listed = i < real_unread
    row = tl.where(listed, tl.load(unread + i, mask=listed, other=0), num_src - 1)
    tl.store(unread_out + i, row, mask=i < num_dst)
