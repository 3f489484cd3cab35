"""The Triton kernels of `loader.hop_kernels` (see there for what each does and why).

Imported only when a hop runs on a GPU (or under Triton's interpreter in the tests): the
loader itself runs without Triton on a CPU.
"""
import triton
import triton.language as tl


@triton.jit
def hash_slot(key, mask):
    """The table entry (``mask`` = table size - 1) a key's probe starts at."""
    mixed = key * -7046029254386353131          # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing
    return (mixed ^ (mixed >> 29)) & mask


@triton.jit
def uniform_below(seed, offset, bound):
    """A draw in ``[0, bound)``: a 62-bit Philox draw (two of the four 32-bit words one
    call makes) reduced modulo ``bound``, as `sampler.uniform_below` draws on the torch
    path. One 32-bit word modulo a degree left in-edges past 2^32 unreachable and, at a
    hub of 10^8 in-edges, gave some edges 43/42 of the others' chance."""
    high, low, _, _ = tl.randint4x(seed, offset)
    draw = ((high.to(tl.int64) & 0x3FFFFFFF) << 32) | (low.to(tl.int64) & 0xFFFFFFFF)
    return draw % bound


# Counts and seeds change with every batch, and Triton compiles a variant per integer
# argument that is 1 or a multiple of 16: specialized on them, the loader kept compiling
# variants inside timed epochs (products-sized, 193 batches: 9.85 s, then 1.18 s without).
@triton.jit(do_not_specialize=["num_dst", "seed", "num_nodes"])
def sample(rowptr, col, seeds, num_dst, seed, slot_src, slot_eid, count, num_nodes,
           K: tl.constexpr, KP: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = r < num_dst
    v = tl.load(seeds + r, mask=rmask, other=0).to(tl.int64)
    start = tl.load(rowptr + v, mask=rmask, other=0).to(tl.int64)
    deg = tl.load(rowptr + v + 1, mask=rmask, other=0).to(tl.int64) - start
    lanes = tl.arange(0, KP)
    chosen = tl.full([ROWS, KP], -1, tl.int64)
    for i in tl.static_range(K):
        top = deg - K + i                      # Floyd's step i draws t in [0, top]
        t = uniform_below(seed, r * K + i, tl.maximum(top + 1, 1))
        taken = tl.sum((chosen == t[:, None]).to(tl.int32), axis=1) > 0
        pick = tl.where(deg > K, tl.where(taken, top, t), i)     # a row of <= K edges keeps them all
        chosen = tl.where(lanes[None, :] == i, pick[:, None], chosen)
    taken_count = tl.minimum(deg, K)
    valid = (lanes[None, :] < taken_count[:, None]) & rmask[:, None]
    eid = start[:, None] + chosen
    src = tl.load(col + eid, mask=valid, other=0).to(tl.int64)
    slot = r.to(tl.int64)[:, None] * K + lanes[None, :]
    inside = rmask[:, None] & (lanes[None, :] < K)
    tl.store(slot_src + slot, tl.where(valid, src, num_nodes), mask=inside)
    tl.store(slot_eid + slot, tl.where(valid, eid, 0), mask=inside)
    tl.store(count + r, taken_count, mask=rmask)


@triton.jit
def position_key(seeds, slot_src, p, pmask, num_dst, num_nodes):
    """The id at position ``p`` of [destinations, sampled slots]; ``num_nodes`` where the
    slot is empty or ``p`` is out of range."""
    is_dst = p < num_dst
    key_dst = tl.load(seeds + p, mask=pmask & is_dst, other=0).to(tl.int64)
    key_src = tl.load(slot_src + (p - num_dst), mask=pmask & (p >= num_dst), other=num_nodes).to(tl.int64)
    return tl.where(is_dst, key_dst, tl.where(pmask, key_src, num_nodes))


@triton.jit
def positions(seeds, slot_src, num_dst, num_all, num_nodes, mask, POSITIONS: tl.constexpr):
    """This program's positions, which are in range, their keys, which hold an id (not
    an empty slot), and each key's first table entry to probe."""
    p = tl.program_id(0).to(tl.int64) * POSITIONS + tl.arange(0, POSITIONS)
    pmask = p < num_all
    key = position_key(seeds, slot_src, p, pmask, num_dst, num_nodes)
    return p, pmask, key, pmask & (key != num_nodes), hash_slot(key, mask)


@triton.jit(do_not_specialize=["num_dst", "num_all", "num_nodes", "mask"])
def insert(seeds, slot_src, num_dst, num_all, num_nodes, keys, first_of, mask, SPARE: tl.constexpr,
           POSITIONS: tl.constexpr):
    p, pmask, key, active, h = positions(seeds, slot_src, num_dst, num_all, num_nodes, mask, POSITIONS)
    # Lanes that need no swap aim theirs at spare entries past the table (atomic_cas has
    # no mask), spread over SPARE of them: aimed at one, they serialized on it.
    spare = mask + 1 + (p & (SPARE - 1))
    while tl.max(active.to(tl.int32), axis=0) > 0:
        # A plain read first: a hub's id fills many slots of a hop, and swapping on its
        # entry every time serialized them; only an empty entry is swapped for.
        stored = tl.load(keys + h, mask=active, other=-2)
        swap = active & (stored == -1)
        prev = tl.atomic_cas(keys + tl.where(swap, h, spare), tl.where(swap, -1, -2).to(tl.int64), key)
        placed = active & ((stored == key) | (swap & ((prev == -1) | (prev == key))))
        earliest = tl.load(first_of + h, mask=placed, other=0)
        tl.atomic_min(first_of + h, p.to(tl.int32), mask=placed & (p < earliest))
        active = active & ~placed
        h = tl.where(active, (h + 1) & mask, h)


@triton.jit(do_not_specialize=["num_dst", "num_all", "num_nodes", "mask"])
def find_first(seeds, slot_src, num_dst, num_all, num_nodes, keys, first_of, first_pos, is_first, mask,
               POSITIONS: tl.constexpr):
    p, pmask, key, active, h = positions(seeds, slot_src, num_dst, num_all, num_nodes, mask, POSITIONS)
    found = tl.full([POSITIONS], -1, tl.int64)
    while tl.max(active.to(tl.int32), axis=0) > 0:
        stored = tl.load(keys + h, mask=active, other=-1)
        hit = active & (stored == key)
        found = tl.where(hit, tl.load(first_of + h, mask=hit, other=0).to(tl.int64), found)
        active = active & ~hit
        h = tl.where(active, (h + 1) & mask, h)
    tl.store(first_pos + p, found, mask=pmask)
    tl.store(is_first + p, (found == p).to(tl.int64), mask=pmask)


@triton.jit(do_not_specialize=["num_dst", "num_all", "num_nodes", "mask"])
def emit(seeds, slot_src, slot_eid, num_dst, num_all, num_nodes, first_pos, numbered, count, rowptr,
         local_src, dst, eid, nodes, out_degrees, K: tl.constexpr, POSITIONS: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * POSITIONS + tl.arange(0, POSITIONS)
    pmask = p < num_all
    key = position_key(seeds, slot_src, p, pmask, num_dst, num_nodes)
    q = tl.load(first_pos + p, mask=pmask, other=-1)
    has_id = pmask & (q >= 0)
    local = tl.load(numbered + q, mask=has_id, other=1) - 1
    tl.store(nodes + local, key, mask=has_id & (q == p))
    s = p - num_dst                                       # the slot of a sampled position
    row = s // K
    lane = s - row * K
    is_edge = has_id & (p >= num_dst)
    is_edge = is_edge & (lane < tl.load(count + row, mask=is_edge, other=0))
    e = tl.load(rowptr + row, mask=is_edge, other=0) + lane
    tl.store(local_src + e, local, mask=is_edge)
    tl.store(dst + e, row, mask=is_edge)
    tl.store(eid + e, tl.load(slot_eid + s, mask=is_edge, other=0), mask=is_edge)
    tl.atomic_add(out_degrees + local, tl.full([POSITIONS], 1, tl.int64), mask=is_edge)
