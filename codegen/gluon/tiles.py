"""What every prefill tile body shares: the tiles' order, the loader partition, and the consumers' K loop.

A program walks tiles pid, pid + P, ... of a [rows, N] output in the grouped order (`tile_at`). Its loader warp copies
each tile's [BM, BK] input and [BN, BK] weight chunks by TMA into a ring of STAGES slots (`ready` barriers say a
slot is full, `empty` ones that the consumers are done with it), running ahead across tiles; its consumer warp groups
multiply each slot on `wgmma` with one product in flight (`tile_product`). Both count the ring's slots from 0 across
the program's tiles, so they agree on every slot and phase without saying more to each other.

Stream-K, for a step of few rows (a batched decode step), whose tiles are too few for the SMs (Llama-3-8B's o_proj at
64 rows: 32 [128, 128] tiles for 132 SMs): the programs share the flattened (tile, K chunk) space in equal contiguous
ranges instead (`streamk_loader`, `fragment`). A tile that a range covers whole is finished as the tile bodies finish
it; a tile cut between programs (a program cuts at most its range's first and last) has each fragment's fp32 partial
stored in a scratch (slot 2p for program p's first fragment, 2p + 1 for its last) and takes the tile's ticket; the
last to arrive sums the partials in program order (`finish_fragment`). No program waits on another.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from codegen.layout import ALIGN as REGION_ALIGN

ALIGN = gl.constexpr(REGION_ALIGN)


@gluon.jit
def _region(off):
    """A region's offset (a descriptor word or an arena's plane), said to be what `codegen.layout` makes every
    region's: a multiple of ALIGN elements. Then a thread's 8 bf16 (or 4 fp32) from it are one 16-byte access,
    where an offset read at run time left the compiler 2-byte ones (QKV's epilogue stored and read everything so)."""
    return off // ALIGN * ALIGN


@gluon.jit
def tile_at(t, num_m, num_n, GROUP: gl.constexpr):
    """Tile t's (row block, column block): GROUP row blocks take each column block in turn, so that the programs
    running at once share a few column blocks' weights in L2."""
    per_group = GROUP * num_n
    first = (t // per_group) * GROUP
    rows = gl.minimum(num_m - first, GROUP)
    return first + (t % per_group) % rows, (t % per_group) // rows


@gluon.jit
def tile_loader(x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES: gl.constexpr,
                GROUP: gl.constexpr):
    """The loader partition: every chunk of this program's tiles into the ring, in the consumers' order."""
    i = 0  # (a tensor, as the slot count the loop carries)
    load_tiles(x_desc, w_desc, a_ring, b_ring, ready, empty, i, num_m, num_n, K, STAGES, GROUP)


@gluon.jit
def load_tiles(x_desc, w_desc, a_ring, b_ring, ready, empty, i, num_m, num_n, K, STAGES: gl.constexpr,
               GROUP: gl.constexpr):
    """Every chunk of this program's tiles into ring slots i ..; returns the slot after them."""
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, n = tile_at(t, num_m, num_n, GROUP)
        i = load_tile(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, K, STAGES)
    return i


@gluon.jit
def load_tile(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, K, STAGES: gl.constexpr):
    """Tile (m, n)'s chunks into ring slots i ..; returns the next tile's first slot."""
    return load_range(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, 0, K, STAGES)


@gluon.jit
def load_range(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, k_lo, k_hi, STAGES: gl.constexpr):
    """Tile (m, n)'s chunks of K from k_lo to k_hi (multiples of BK, or K) into ring slots i ..; returns the slot
    after them."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    BK: gl.constexpr = a_ring.type.shape[2]
    for k in range(k_lo, k_hi, BK):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # (a barrier starts as if its phase 1 were done)
        mbarrier.expect(ready.index(s), (BM + BN) * BK * 2)
        tma.async_copy_global_to_shared(x_desc, [m * BM, k], ready.index(s), a_ring.index(s))
        tma.async_copy_global_to_shared(w_desc, [n * BN, k], ready.index(s), b_ring.index(s))
        i += 1
    return i


@gluon.jit
def tile_product(a_ring, b_ring, ready, empty, i, K, STAGES: gl.constexpr):
    """The consumers' fp32 [BM, BN] product of one tile, from ring slot i on; returns it and the next tile's slot."""
    return range_product(a_ring, b_ring, ready, empty, i, 0, K, STAGES)


@gluon.jit
def range_product(a_ring, b_ring, ready, empty, i, k_lo, k_hi, STAGES: gl.constexpr):
    """`tile_product` over K's chunks from k_lo to k_hi (`load_range`'s): the partial product."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    BK: gl.constexpr = a_ring.type.shape[2]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    acc = gl.zeros([BM, BN], gl.float32, acc_layout)
    for k in range(k_lo, k_hi, BK):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        # the product before this one is done: its slot goes back to the loader
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > k_lo)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
    return acc, i


@gluon.jit
def ring(BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """The ring's slots and barriers: (a_ring [STAGES, BM, BK], b_ring [STAGES, BN, BK], ready, empty)."""
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_layout)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return a_ring, b_ring, ready, empty


@gluon.jit
def operands(X, x_stride, num_rows, W, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """Tensor descriptors of the input [num_rows, K] rows x_stride apart at X and the weight [N, K] at W."""
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    x_desc = tma.make_tensor_descriptor(X, [num_rows, K], [x_stride, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(W, [N, K], [K.to(gl.int64), 1], [BN, BK], b_layout)
    return x_desc, w_desc


STREAMK_ROWS = gl.constexpr(64)  # the most rows of a stream-K step: a part of its scratch holds STREAMK_ROWS x BN fp32


@gluon.jit
def _share(p, P, total):
    """Program p's range of `total` chunks: equal and contiguous."""
    return p * total // P, (p + 1) * total // P


@gluon.jit
def _program_of(c, P, total):
    """The program whose `_share` holds chunk c."""
    return ((c + 1) * P + total - 1) // total - 1


@gluon.jit
def _slot(p, P, total, t, KC):
    """Where program p keeps its partial of tile t: 2p where its range starts inside t, else 2p + 1."""
    c0, _ = _share(p, P, total)
    return 2 * p + (c0 <= t * KC).to(gl.int32)


@gluon.jit
def streamk_range(num_m, num_n, K, BK: gl.constexpr):
    """This program's range c .. c1 of the flattened (tile, chunk) space, a tile's chunks, all the chunks and the
    programs that share them: no more than the chunks (every sharing program has one at least, so that a tile's
    contributors are the programs from its first chunk's to its last's); the others' ranges are empty."""
    KC = gl.cdiv(K, BK)
    total = num_m * num_n * KC
    P = gl.minimum(gl.num_programs(0), total)
    pid = gl.program_id(0)
    c, c1 = _share(gl.minimum(pid, P), P, total)
    return c, gl.where(pid < P, c1, c), KC, total, P


@gluon.jit
def fragment(c, c1, KC):
    """The tile of chunk c (tiles of KC chunks) and the chunks [kc0, kc1) of it that a range from c to c1 covers."""
    t = c // KC
    kc0 = c - t * KC
    return t, kc0, gl.minimum(KC, kc0 + (c1 - c))


@gluon.jit
def streamk_loader(x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES: gl.constexpr,
                   GROUP: gl.constexpr):
    """The loader partition of a stream-K body: this program's range of chunks into the ring, fragment by fragment."""
    BK: gl.constexpr = a_ring.type.shape[2]
    c, c1, KC, _, _ = streamk_range(num_m, num_n, K, BK)
    i = 0
    while c < c1:
        t, kc0, kc1 = fragment(c, c1, KC)
        m, n = tile_at(t, num_m, num_n, GROUP)
        i = load_range(x_desc, w_desc, a_ring, b_ring, ready, empty, i, m, n, kc0 * BK, gl.minimum(kc1 * BK, K),
                       STAGES)
        c += kc1 - kc0


@gluon.jit
def streamk_step(a_ring, b_ring, ready, empty, i, c, c1, KC, total, P, K, num_m, num_n, num_rows, F32, parts_at,
                 tickets_at, STAGES: gl.constexpr, GROUP: gl.constexpr):
    """The consumers' next fragment of their range from chunk c (`fragment`): its products from ring slot i on, then
    `finish_fragment`. Returns whether this program finishes the fragment's tile and its whole product if so, the
    tile's (row block, column block), the next fragment's slot and chunk."""
    BK: gl.constexpr = a_ring.type.shape[2]
    t, kc0, kc1 = fragment(c, c1, KC)
    m, n = tile_at(t, num_m, num_n, GROUP)
    acc, i = range_product(a_ring, b_ring, ready, empty, i, kc0 * BK, gl.minimum(kc1 * BK, K), STAGES)
    finish, acc = finish_fragment(acc, t, kc0, kc1, KC, total, P, num_rows, F32, parts_at, tickets_at)
    return finish, acc, m, n, i, c + kc1 - kc0


@gluon.jit
def finish_fragment(acc, t, kc0, kc1, KC, total, P, num_rows, F32, parts_at, tickets_at):
    """Whether this program finishes tile t, whose chunks kc0 .. kc1 it multiplied into acc, and the tile's whole
    product if it does: at once where it multiplied all of them; else its partial into the scratch at F32[parts_at]
    (rows below num_rows), the tile's ticket at F32[tickets_at + t] (zeroed again by the last), and, arriving last,
    every partial summed in program order. P: the programs sharing the chunks (`streamk_range`)."""
    BM: gl.constexpr = acc.type.shape[0]
    BN: gl.constexpr = acc.type.shape[1]
    PART: gl.constexpr = STREAMK_ROWS * BN
    finish = (kc0 == 0) & (kc1 == KC)
    if not finish:
        p = gl.program_id(0)
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, acc.type.layout))
        cols = gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
        at = rows[:, None] * BN + cols[None, :]
        keep = (rows < num_rows)[:, None] & (cols < BN)[None, :]
        parts = F32 + _region(parts_at)
        gl.store(parts + _slot(p, P, total, t, KC) * PART + at, acc, mask=keep)
        first, last = _program_of(t * KC, P, total), _program_of((t + 1) * KC - 1, P, total)
        gl.thread_barrier()  # every thread's partial stored before the ticket publishes it (`arrives_last`)
        arrived = gl.atomic_add(F32 + tickets_at + t, 1.0, sem="acq_rel")
        gl.thread_barrier()
        finish = arrived == (last - first).to(gl.float32)
        if finish:
            gl.store(F32 + tickets_at + t, 0.0)  # (for the group after)
            acc = gl.zeros_like(acc)
            for q in range(first, last + 1):  # in program order, whoever arrived last
                acc += gl.load(parts + _slot(q, P, total, t, KC) * PART + at, mask=keep, other=0.0,
                               cache_modifier=".cg")
    return finish, acc


def streamk_unsupported(tiles: int, bn: int, programs: int, room: tuple[int, int]) -> str | None:
    """Why a stream-K body cannot take a group of `tiles` tiles of BN columns on `programs` programs (None: it can),
    room = (floats of its scratch, its tickets)."""
    parts, tickets = room
    need = 2 * programs * STREAMK_ROWS.value * bn
    if need > parts:
        return f"its scratch holds {parts} floats, {programs} programs' parts {need}"
    if tiles > tickets:
        return f"its {tiles} tiles want a ticket each, {tickets} there"
    return None
