"""One-off exploration behind the CSR kernel's launch shape: hand-written neighbour-sum
variants, timed on the GPU against torch.sparse.mm and the generated kernel.

- ``seg2d``: the generated kernel's schedule (degree-sorted segments, ROWS per program,
  BLOCK_E edges per chunk) swept over num_warps and over reducing each chunk at once
  (DEFER=0) or accumulating a 2-D tile and reducing once (DEFER=1);
- ``seg3d``: BLOCK_R segments per program walked in lockstep, K edges each.

Each variant's output is checked against cuSPARSE before it is timed. The H100 result
(benchmarks/results/kernel_variants.json, summarised in benchmarks/README.md) is why the
generated CSR kernels run one warp per program. Kept to rerun when the kernel changes;
``DEV=cpu TRITON_INTERPRET=1`` checks the variants on CPU (slowly).
"""
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

import gnnfuse
from gnnfuse.backend.triton.schedule import _build
from gnnfuse.data import load_dataset

DEV = os.environ.get("DEV", "cuda")
OUT = os.environ.get("OUT", "/tmp")
RESULTS = {}

@triton.jit
def seg2d(seg_row, seg_start, seg_end, seg_split, nseg, col, x, out, F: tl.constexpr,
          BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr, ROWS: tl.constexpr, DEFER: tl.constexpr):
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    for r in range(ROWS):
        seg = tl.program_id(0) * ROWS + r
        if seg < nseg:
            row = tl.load(seg_row + seg)
            start = tl.load(seg_start + seg)
            end = tl.load(seg_end + seg)
            if DEFER:
                acc2 = tl.zeros([BLOCK_E, BLOCK_F], tl.float32)
                for e0 in range(start, end, BLOCK_E):
                    e = e0 + tl.arange(0, BLOCK_E)
                    em = e < end
                    nbr = tl.load(col + e, mask=em, other=0)
                    acc2 += tl.load(x + nbr[:, None] * F + f[None, :], mask=em[:, None] & fmask[None, :], other=0.0)
                acc = tl.sum(acc2, 0)
            else:
                acc = tl.zeros([BLOCK_F], tl.float32)
                for e0 in range(start, end, BLOCK_E):
                    e = e0 + tl.arange(0, BLOCK_E)
                    em = e < end
                    nbr = tl.load(col + e, mask=em, other=0)
                    acc += tl.sum(tl.load(x + nbr[:, None] * F + f[None, :], mask=em[:, None] & fmask[None, :], other=0.0), 0)
            if tl.load(seg_split + seg) != 0:
                tl.atomic_add(out + row * F + f, acc, mask=fmask)
            else:
                tl.store(out + row * F + f, acc, mask=fmask)


@triton.jit
def seg3d(seg_row, seg_start, seg_end, seg_split, nseg, col, x, out, F: tl.constexpr,
          BLOCK_R: tl.constexpr, K: tl.constexpr, BLOCK_F: tl.constexpr):
    s = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    smask = s < nseg
    row = tl.load(seg_row + s, mask=smask, other=0)
    start = tl.load(seg_start + s, mask=smask, other=0)
    n = tl.load(seg_end + s, mask=smask, other=0) - start
    longest = tl.max(n, 0)
    f = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    fmask = f < F
    acc = tl.zeros([BLOCK_R, BLOCK_F], tl.float32)
    for k0 in range(0, longest, K):
        k = k0 + tl.arange(0, K)
        em = k[None, :] < n[:, None]
        nbr = tl.load(col + start[:, None] + k[None, :], mask=em, other=0)
        vals = tl.load(x + nbr[:, :, None] * F + f[None, None, :], mask=em[:, :, None] & fmask[None, None, :], other=0.0)
        acc += tl.sum(vals, 1)
    split = tl.load(seg_split + s, mask=smask, other=0) != 0
    ptr = out + row[:, None] * F + f[None, :]
    m = smask[:, None] & fmask[None, :]
    tl.store(ptr, acc, mask=m & (~split)[:, None])
    tl.atomic_add(ptr, acc, mask=m & split[:, None])


@gnnfuse.vertex
def nsum(v):
    return sum([u.h for u in v.innbs])


def timeit(fn, reps=30):
    if DEV == "cpu":
        fn(); return 0.0
    for _ in range(3): fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record(); fn(); end.record(); end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def checked_time(launch, shape, ref):
    """Median ms of ``launch(out)`` into a zeroed ``out`` (split rows add atomically),
    or why it was not timed: a wrong result against ``ref`` or a failure to compile."""
    out = torch.zeros(shape, device=DEV)

    def run():
        out.zero_()
        launch(out)
    try:
        run()
        if DEV == "cuda":
            torch.cuda.synchronize()
        err = ((out - ref).abs().max() / ref.abs().max()).item()
        return timeit(run) if err < 1e-4 else f"wrong {err}"
    except Exception as exc:  # noqa: BLE001 - a variant Triton cannot compile is a result too
        return f"fail {type(exc).__name__}: {str(exc)[:100]}"


def kernel_variants(name, graph, widths):
    g = graph.to(DEV)
    csr = g.csr()
    rowptr, col = csr.rowptr, csr.col
    rowptr64 = rowptr.to(torch.int64)
    segs = _build(rowptr64, 512)
    row, st, en, sp = segs.row.int(), segs.start.int(), segs.end.int(), segs.split
    col32 = col.int()
    nseg = len(segs)
    adj = torch.sparse_csr_tensor(rowptr.int(), col32, torch.ones(col.numel(), device=DEV), (g.num_nodes, g.num_nodes))
    for F in widths:
        x = torch.randn(g.num_nodes, F, device=DEV)
        ref = torch.sparse.mm(adj, x)
        res = {"sparse-mm": timeit(lambda: torch.sparse.mm(adj, x))}
        res["gnnfuse-api"] = timeit(lambda: nsum(g, {"h": x}))
        bf = min(triton.next_power_of_2(F), 128)
        nf = triton.cdiv(F, bf)
        shape = (g.num_nodes, F)
        for be, rows, w, defer in itertools.product((16, 64), (1, 4), (1, 4), (0, 1)):
            res[f"2d be{be} rows{rows} w{w} defer{defer}"] = checked_time(
                lambda out: seg2d[(triton.cdiv(nseg, rows), nf)](
                    row, st, en, sp, nseg, col32, x, out, F, be, bf, rows, defer, num_warps=w), shape, ref)
        budget = max(2048, 8 * bf)
        for r, w in itertools.product((2, 8, 32, 64), (2, 4, 8)):
            k = budget // (r * bf)
            if 1 <= k <= 64:
                res[f"3d r{r} k{k} w{w}"] = checked_time(
                    lambda out: seg3d[(triton.cdiv(nseg, r), nf)](
                        row, st, en, sp, nseg, col32, x, out, F, r, k, bf, num_warps=w), shape, ref)
        zero = timeit(lambda: torch.zeros(g.num_nodes, F, device=DEV).zero_())
        res["zero-fill"] = zero
        RESULTS[f"{name}/{F}"] = res
        num = {k: v for k, v in res.items() if isinstance(v, float)}
        best = sorted(num.items(), key=lambda kv: kv[1])[:6]
        print(f"[{name}] F={F} sparse-mm {res['sparse-mm']:.3f} api {res['gnnfuse-api']:.3f} | best: " +
              ", ".join(f"{k}={v:.3f}" for k, v in best))
        fails = [k for k, v in res.items() if isinstance(v, str)]
        if fails: print("   failed:", fails[:4], res[fails[0]])
        sys.stdout.flush()
        json.dump(RESULTS, open(f"{OUT}/explore.json", "w"), indent=1)


if __name__ == "__main__":
    # python benchmarks/explore_kernels.py arxiv-like 16,40,64,128,512   (writes $OUT/explore.json)
    for name in sys.argv[1].split(","):
        kernel_variants(name, load_dataset(name).graph, [int(f) for f in sys.argv[2].split(",")])
