"""A batched decode step's layers as one persistent Gluon kernel: 1 to 64 rows, and the loop over such steps.

The one-row loop (`chain.decode_chain`) runs its projections on the GEMV (CUDA cores), which a step of many rows
cannot afford; the stream-K bodies (`tiles.py`: [64, 128] tiles on one consumer warp group, the programs sharing the
flattened (tile, K chunk) space in equal contiguous ranges) run them on `wgmma`, but as group kernels each launch
paid its ramp and its tail (session 63: o_proj 27.6 us for 34.7 MB, down 47.4 for 120 MB, at 64 rows). This kernel
runs them as the one-row loop runs its groups: one program an SM walks the table's groups (QKV, attention, o_proj,
gate/up, down, layer after layer), events between them, and its loader copies the first slots of a projection's
weights before the group before is done (they do not depend on it), the step's rows beside them once it is. Over
steps (`steps` > 1, the table from `GluonCoverage.loop_rows(batched=True)`) each step is planned, embedded, its
logits computed (the LM head in whole [64, 128] tiles) and sampled in it too, as the one-row loop does.

One program an SM (the stream-K scratch holds two partials a program for 132 programs: `prefill_parts`): a loader
warp and one consumer warp group. 208 KB of shared memory: a ring of 8 slots, each a [64, 64] chunk of the step's
rows and a [128, 64] weight chunk (128 KB of weights in flight: session 63 found the stream bound by them), whose
weight chunks are also attention's ring (4 slots of 64 keys, a slot's key halves then its value halves) and, for a
narrow group (o_proj, down, QKV: whole-K tiles of 32 weight rows), the rows' [64, 128] chunk (the weights' [32, 128]
then over the rows' chunk's bytes); each ring with its own barriers and slot count; a 16 KB staging buffer for a
tile's outputs (a projection's, through which they leave by one TMA copy; QKV's heads; attention's queries). A
ring's first copies wait until the consumers have released the other ring's slots (the views overlap). Attention
takes decode items of ITEM_ROWS (8) rows with the keys as wgmma's M (`attention.consume_decode_items`), in splits
where the step's (sequence, KV head) pairs are fewer than the programs.

H200, Llama-3-8B at 64 rows and context 512 (session 67, `benchmarks/explore/chain_probe.py --batch 64`, a layer's
groups traced, medians): QKV 27.2 us (whole-K tiles in two rounds; stream-K: 27.1, a 12.4-us tail of its tiles'
partials summed one at a time), attention 46.2, o_proj 17.7 (whole-K; stream-K: 24.7, a tail of 10.5), gate/up 68.3,
down 37.3 (stream-K: 44.2); the 160 groups 6.31 ms; over steps 6.73 ms a step with the LM head (268 us), sampling
(81) and the plan (23), against the persistent Triton megakernel's TPOT of 6.63: level with it, not yet faster, so
the runtime runs batches on that kernel. Session 71: attention in items of 8 rows (42.1 us), each item's words and
queries read an item ahead (39.8 us), the 160 groups 6.12 ms. Session 72: greedy sampling as the LM head's epilogue
(81.6 -> 7.0 us), the plan's zeroing shared by every program (31.7 -> 5.2 us), the norms' sums added with relaxed
atomics (o_proj 18.0 -> 16.9 us, down 36.8 -> 36.0), gate/up in whole-K tiles too (the 160 groups 6,028 -> 5,775
us): 6.00 ms a step over steps, against 6.90 for the Triton megakernel's TPOT in the decode benchmark and the torch
graph's 7.52 in the same lease. Session 74: QKV in one round of 48-row pair tiles (`_pair_qkv`: each tile's units of
rotary pairs through 3-D boxes, the rotary its own), 26.0 -> 20.5 us a layer, the 160 groups 5,787-5,817 -> 5,707-5,720
us. Session 78: gate/up's narrow tiles four at a time (`_quad_loads`, `_quad_gated`: a slot's rows read once for four
tiles' weights), 66.4-66.8 -> 59.9-62.4 us a layer, the 160 groups 5,612-5,661 -> 5,516-5,609 in the same process.
Sessions 80-81: attention's item boundaries (the next item's q stored during this one's last slot, no fence before a
slot's release, an item's words reduced in the warp), 43.0-43.6 -> 41.0-41.7 us a layer, the 160 groups ~5,510 ->
5,413-5,424 us; a step 5.70-5.82 ms in the decode benchmark, 1.31-1.32x the torch graph. The
host-driven executor takes a batched step's layers here with `chain` (`GluonCoverage.batch_chain`), and its decode
steps in the loop (`HostDriven.generate(loop=True)`).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from codegen.gluon import attention, gemv, linear, qkv, step
from codegen.gluon.chain import (_ATTENTION, _GATED, _LOGITS, _PLAIN, _PLAN, _QKV, _ROW, _SAMPLE, HD, IDS, KEYS,
                                 MAX_SPLITS,
                                 SIGNATURE, _barriers, _clock, _gemv_operands, _go, _group, _hand, _handed, _released,
                                 _signal, _step_group)
from codegen.gluon.events import wait
from codegen.gluon.linear import _norm_sums, _region, _round
from codegen.gluon.tiles import finish_fragment, fragment, operands, range_product, streamk_range, tile_product
from codegen.layout import STEP_LOG

BM = gl.constexpr(linear.STREAMK.bm)  # a tile's rows: the step's
BN = gl.constexpr(linear.STREAMK.bn)  # its weight rows (QKV: a head's)
BK = linear.BK
SK_STAGES = gl.constexpr(linear.STREAMK.stages)
assert qkv.STREAMK.bn == BN.value and qkv.STREAMK.bm == BM.value and qkv.STREAMK.stages == SK_STAGES.value
# attention's slots of 64 keys (a slot's key halves then its value halves, 32 KB) over the same bytes: four, where the
# one-row loop's ring holds three (`ws_decode_attention.py`, session 63: 4 stages, b64 at context 513 in 39.9 us)
ATT_STAGES = gl.constexpr(4)
assert 4 * ATT_STAGES.value * KEYS.value * (HD.value // 2) <= SK_STAGES.value * BN.value * BK.value

# attention's items: a sequence's query heads of one KV head (a step that only decodes: REP of them, 4 for Llama-3),
# 8 rows a product with the keys as wgmma's M (`attention.consume_decode_items`), not 64 with the rows as M
ITEM_ROWS = gl.constexpr(8)

# a plain projection of few weight rows (N <= NARROW_BN x the programs: Llama-3-8B's o_proj and down; QKV in two
# rounds; gate/up in seven, `GluonCoverage.batch_narrow`) in whole-K tiles of NARROW_BN, pid, pid + P, ..: no partials
# to exchange (their stores, tickets and sums were ~1 ms of a b64 step, session 67: `chain_probe --probes 2`), the
# step's rows read whole by every tile instead (from L2: not copying them saved 2% where `--probes 1` reached them
# then, the stream-K groups; it reaches the narrow ones too since session 69). A ring slot holds NARROW_K columns of
# K: the rows' [BM, NARROW_K] over the weight chunk's bytes, the weights' [NARROW_BN, NARROW_K] over the rows'
# chunk's, the same 24 KB. (`ws_prefill --tokens 64 --max-splits 1 --variants 64x32x128/8`: o_proj 14.0 us, down
# 39.2, as fast as [64, 128] tiles split 8 ways with their sums left out, 13.8 and 38.7.)
NARROW_BN = gl.constexpr(32)
NARROW_K = gl.constexpr(2 * BK.value)
assert BM.value * NARROW_K.value <= BN.value * BK.value and NARROW_BN.value * NARROW_K.value <= BM.value * BK.value

# QKV in one round of PAIR_BN-row tiles where it has no q/k norm and its rows are PAIR_BN x the programs at most
# (`GluonCoverage.batch_narrow`'s word 2; Llama-3-8B: 6,144 rows, 128 tiles for 132 programs, where NARROW_BN tiles
# take two rounds and the second round's 60 tiles were its tail, 8.3 us past the median signal, session 73). A tile is
# PAIR_UNITS units of PAIR_ROWS rotary pairs of one head: rows d and d + HD / 2 for PAIR_ROWS consecutive d, one 3-D
# box a unit over the weight viewed as [2 x heads, HD / 2, K]. So a tile holds both halves of each of its pairs and
# applies the rotary itself, with no scratch, no head's ticket and no tile that finishes a head for the others
# (48-row tiles that met through them lost, their last signal 10.3 us past the median, session 70).
PAIR_ROWS = gl.constexpr(8)
PAIR_UNITS = gl.constexpr(3)
PAIR_BN = gl.constexpr(2 * PAIR_ROWS.value * PAIR_UNITS.value)
UNITS_A_HEAD = gl.constexpr(HD.value // (2 * PAIR_ROWS.value))
assert PAIR_BN.value <= BN.value and 8 * PAIR_ROWS.value <= BN.value  # (a slot's units; `_pair_qkv`'s staging)

# gate/up's narrow tiles QUADS at a time (the table's word 3, `GluonCoverage.batch_narrow`): a program's tiles pid,
# pid + P, .. in fours, each ring slot a [BM, BK] chunk of the rows and the four tiles' [NARROW_BN, BK] weight boxes
# (the stream-K ring's own slots: its [BN, BK] weight view is the four boxes), so the rows are read once for four
# tiles, not once a tile. A narrow slot's rows ([BM, NARROW_K], from L2) are twice its weights' bytes, and alone
# beside a stream they cost it 11% (`benchmarks/explore/tma_stream.py`, H200: 268 MB in 74.7 us with them, 65.7 with
# a quad's, 65.7 with no rows; session 78)
QUADS = gl.constexpr(BN.value // NARROW_BN.value)
# a quad's slots whose weights go in before the event: with the ring's 8 (128 KB), o_proj's epilogue took 2 us longer;
# 2, 4 and 6 were level (5,587, 5,609 and 5,595 us the 160 groups, H200, session 78). These copies, asked from DRAM as
# o_proj's last slots free, hold its outputs' stores and signal back (not the SM's TMA unit: stored from registers,
# the same); copied after o_proj's signal instead, o_proj takes 1.7 us less a layer, gate/up as much more (session
# 79)
QUADS_EARLY = gl.constexpr(SK_STAGES.value // 2)

LAUNCH = linear.STREAMK.launch()  # (one consumer warp group and the loader's, the register file's whole)
# the loader's registers: the consumers' warp group keeps 256 whatever the loader holds up to 256 (two warp groups
# share the register file); at `linear.LOADER_REGS`' 40 the loader ran 139 of the kernel's 311 spill instructions
# (attention's page boxes among them), from 128 none (`benchmarks/explore/spill_profile.py`, session 77)
LOADER_REGS = 128
BATCH_SIGNATURE = {**SIGNATURE, "parts_at": "i64", "tickets_at": "i64", "steps": "i32", "first_step": "i32",
                   "REGIONS": "*i32", "stats_off": "i32", "stats_size": "i32"}


@gluon.jit
def _operands(desc, kind, W, ACT, num_rows, PROBE: gl.constexpr):
    """A projection's input rows and weight as tensor descriptors of [BM, BK] and [BN, BK] boxes, K and its weight
    rows (with PROBE & 8, the weight as `_tiled`'s)."""
    if kind == _QKV:
        x_desc, w_desc = qkv.inputs(desc, W, ACT, num_rows, HD, BM, BN)
        K, HQ, HKV, _, _, _, _, _, _, _, _, _, _, _ = qkv.row(desc)
        N = (HQ + 2 * HKV) * HD
    elif kind == _LOGITS:  # (the sequences' rows, `gather`'s copy: as many as the step's in a step that decodes)
        x_off, K, w_off, N, _, _, _, _, _, _ = gemv.linear_row(desc)
        x_desc, w_desc = operands(ACT + x_off, K.to(gl.int64), num_rows, W + w_off, N, K, BM, BN, BK)
    else:
        x_desc, w_desc = linear.inputs(desc, W, ACT, num_rows, BM, BN)
        K, N, _, _, _, _, _ = linear.row(desc)
    if PROBE & 8:
        _, _, w_off, _ = _gemv_operands(desc, kind == _QKV)
        w_desc = _tiled(W + w_off, N, K, BN)
    return x_desc, w_desc, K, N


@gluon.jit
def _tiled(w, N, K, ROWS: gl.constexpr):
    """(timing only, PROBE & 8) The [N, K] weight at w as if laid out tile after tile: a [N K / BK, BK] view whose
    [ROWS, BK] box at row (t KC + k / BK) ROWS (`_weight_at`) is ROWS x 128 contiguous bytes, where the real layout's
    box reads 128 bytes of each of ROWS rows K x 2 bytes apart. The same bytes, other values: what the weights'
    layout costs the stream."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BK], gl.bfloat16)
    return tma.make_tensor_descriptor(w, [N * K // BK, BK], [BK, 1], [ROWS, BK], layout)


@gluon.jit
def _weight_at(t, k, K, ROWS: gl.constexpr, PROBE: gl.constexpr):
    """The coordinates of tile t's weight box at column k (tiles of ROWS weight rows): [t ROWS, k], or with PROBE & 8
    `_tiled`'s."""
    if PROBE & 8:
        row, col = (t * gl.cdiv(K, BK) + k // BK) * ROWS, k * 0
    else:
        row, col = t * ROWS, k
    return row, col


@gluon.jit
def _chunks(kind, K, N):
    """This program's chunks of a projection: (first, end, chunks a tile). Stream-K's range of the flattened (tile, K
    chunk) space; the LM head's (LOGITS: a thousand tiles, a few rounds of the programs) whole tiles pid, pid + P, ..:
    its chunk u is tile pid + (u // KC) P's chunk u % KC (`_chunk`)."""
    KC = gl.cdiv(K, BK)
    if kind == _LOGITS:
        pid, P = gl.program_id(0), gl.num_programs(0)
        c, c1 = gl.to_tensor(0), gl.maximum(gl.cdiv(gl.cdiv(N, BN) - pid, P), 0) * KC
    else:
        c, c1, KC, _, _ = streamk_range(1, gl.cdiv(N, BN), K, BK)
    return c, c1, KC


@gluon.jit
def _chunk(kind, q, KC):
    """Chunk q of this program's (`_chunks`): its tile and its column of K."""
    if kind == _LOGITS:
        t = gl.program_id(0) + (q // KC) * gl.num_programs(0)
    else:
        t = q // KC
    return t, (q % KC) * BK


@gluon.jit
def _fill(x_desc, w_desc, a_ring, b_ring, ready, empty, i, t, k, K, ROWS: gl.constexpr, PROBE: gl.constexpr):
    """Ring slot use i: tile t's weight chunk at column k and (ROWS) the rows' chunk beside it (the step's rows are
    one row block), once the consumers have released the slot's use before; returns i + 1. Without ROWS the slot
    still expects the rows' bytes (`_projection_loads` sends them later)."""
    s = i % SK_STAGES
    mbarrier.wait(empty.index(s), ((i // SK_STAGES) & 1) ^ 1)  # (a barrier starts as if its phase 1 were done)
    mbarrier.expect(ready.index(s), (BN if PROBE & 1 else BM + BN) * BK * 2)
    w_row, w_col = _weight_at(t, k, K, BN, PROBE)
    tma.async_copy_global_to_shared(w_desc, [w_row, w_col], ready.index(s), b_ring.index(s))
    if ROWS and not PROBE & 1:
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), a_ring.index(s))
    return i + 1


@gluon.jit
def _projection_loads(desc, kind, W, ACT, num_rows, a_ring, b_ring, ready, empty, kv_empty, i, j, EVENTS, e, events,
                      TRACING: gl.constexpr, PROBE: gl.constexpr):
    """A projection's chunks of this program's from ring slot i on: its first slots' weights, then (the group before
    done) their rows' chunks and the rest; returns the slot after them. Its tensor descriptors go where the group two
    before had its own, whose copies are done by then (the group before's may not be)."""
    if e % 2 == 0:
        x_desc, w_desc, K, N = _operands(desc, kind, W, ACT, num_rows, PROBE)
    else:
        x_desc, w_desc, K, N = _operands(desc, kind, W, ACT, num_rows, PROBE)
    c, c1, KC = _chunks(kind, K, N)
    early = gl.minimum(c1 - c, SK_STAGES)
    _released(kv_empty, j, j, ATT_STAGES)  # (attention's slots, over the same bytes, read)
    i0 = i
    for q in range(c, c + early):
        t, k = _chunk(kind, q, KC)
        i = _fill(x_desc, w_desc, a_ring, b_ring, ready, empty, i, t, k, K, False, PROBE)
    if not PROBE & 16:
        wait(EVENTS, e - 1, gl.num_programs(0))
    _clock(EVENTS, events, e, 0, TRACING)
    for q in range(c, c + early):
        if not PROBE & 1:
            s = (i0 + q - c) % SK_STAGES
            tma.async_copy_global_to_shared(x_desc, [0, (q % KC) * BK], ready.index(s), a_ring.index(s))
    for q in range(c + early, c1):
        t, k = _chunk(kind, q, KC)
        i = _fill(x_desc, w_desc, a_ring, b_ring, ready, empty, i, t, k, K, True, PROBE)
    return i


@gluon.jit
def _narrow_views(a_ring, b_ring):
    """The ring's slots as a narrow group's: the rows' two [BM, BK] boxes over the weight chunk's bytes, the weights'
    two [NARROW_BN, BK] over the rows' chunk's."""
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NARROW_BN, BK], gl.bfloat16)
    xs = b_ring._reinterpret(gl.bfloat16, [2 * SK_STAGES, BM, BK], x_layout)
    ws = a_ring._reinterpret(gl.bfloat16, [2 * SK_STAGES, NARROW_BN, BK], w_layout)
    return xs, ws


@gluon.jit
def _narrow_loads(desc, is_qkv, W, ACT, box_rows, a_ring, b_ring, ready, empty, kv_empty, i, j, EVENTS, e, events,
                  TRACING: gl.constexpr, PROBE: gl.constexpr):
    """A narrow group's tiles (this program's: pid, pid + P, ..) from ring slot i on, NARROW_K columns a slot: its
    first slots' weights, then (the group before done) their rows' boxes and the rest; returns the slot after them.
    box_rows: the rows its descriptor spans, the step's and the rows after them up to a box where the region holds
    them (a box past the rows' end cost the group twice its time: at 8 rows, H200, session 73, gate/up took 140 us
    against 66 at 64 rows; the rows past the step's are the consumers' to leave out)."""
    xs, ws = _narrow_views(a_ring, b_ring)
    x_desc, w_desc, K, N = _narrow_descs(desc, is_qkv, W, ACT, box_rows, e, PROBE)
    pid, P = gl.program_id(0), gl.num_programs(0)
    KC = gl.cdiv(K, NARROW_K)  # (a tile's slots; its chunk u: tile pid + (u // KC) P's columns (u % KC) NARROW_K)
    chunks = gl.maximum(gl.cdiv(gl.cdiv(N, NARROW_BN) - pid, P), 0) * KC
    early = gl.minimum(chunks, SK_STAGES)
    _released(kv_empty, j, j, ATT_STAGES)  # (attention's slots, over the same bytes, read)
    i0 = i
    for u in range(0, early):
        i = _narrow_fill(x_desc, w_desc, xs, ws, ready, empty, i, pid + (u // KC) * P, (u % KC) * NARROW_K, K, False,
                         PROBE)
    if not PROBE & 16:
        wait(EVENTS, e - 1, P)
    _clock(EVENTS, events, e, 0, TRACING)
    for u in range(0, early):
        s = (i0 + u) % SK_STAGES
        for b in gl.static_range(2):
            if not PROBE & 1:
                tma.async_copy_global_to_shared(x_desc, [0, (u % KC) * NARROW_K + b * BK], ready.index(s),
                                                xs.index(2 * s + b))
    for u in range(early, chunks):
        i = _narrow_fill(x_desc, w_desc, xs, ws, ready, empty, i, pid + (u // KC) * P, (u % KC) * NARROW_K, K, True,
                         PROBE)
    return i


@gluon.jit
def _narrow_descs(desc, is_qkv, W, ACT, box_rows, e, PROBE: gl.constexpr):
    """A narrow group's rows and weight as tensor descriptors (`_narrow_operands`), K and its weight rows. They go
    where the group two before had its own (whose copies are done by then; the group before's may not be)."""
    x_off, K, w_off, N = _gemv_operands(desc, is_qkv)
    if e % 2 == 0:
        x_desc, w_desc = _narrow_operands(ACT + x_off, K, box_rows, W + w_off, N, PROBE)
    else:
        x_desc, w_desc = _narrow_operands(ACT + x_off, K, box_rows, W + w_off, N, PROBE)
    return x_desc, w_desc, K, N


@gluon.jit
def _narrow_operands(x, K, num_rows, w, N, PROBE: gl.constexpr):
    """A narrow group's rows and weight as tensor descriptors of [BM, BK] and [NARROW_BN, BK] boxes (with PROBE & 8,
    the weight as `_tiled`'s)."""
    x_desc, w_desc = operands(x, K.to(gl.int64), num_rows, w, N, K, BM, NARROW_BN, BK)
    if PROBE & 8:
        w_desc = _tiled(w, N, K, NARROW_BN)
    return x_desc, w_desc


@gluon.jit
def _narrow_fill(x_desc, w_desc, xs, ws, ready, empty, i, t, k, K, ROWS: gl.constexpr, PROBE: gl.constexpr):
    """`_fill` for a narrow group: tile t's weight boxes at columns k, k + BK and (ROWS) the rows' beside them (none
    with PROBE & 1: timing only)."""
    s = i % SK_STAGES
    mbarrier.wait(empty.index(s), ((i // SK_STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), (NARROW_BN if PROBE & 1 else BM + NARROW_BN) * NARROW_K * 2)
    for b in gl.static_range(2):
        w_row, w_col = _weight_at(t, k + b * BK, K, NARROW_BN, PROBE)
        tma.async_copy_global_to_shared(w_desc, [w_row, w_col], ready.index(s), ws.index(2 * s + b))
        if ROWS and not PROBE & 1:
            tma.async_copy_global_to_shared(x_desc, [0, k + b * BK], ready.index(s), xs.index(2 * s + b))
    return i + 1


@gluon.jit
def _quad_loads(desc, W, ACT, box_rows, a_ring, b_ring, ready, empty, kv_empty, i, j, EVENTS, e, events,
                TRACING: gl.constexpr, PROBE: gl.constexpr):
    """gate/up's narrow tiles QUADS at a time (this program's: pid, pid + P, .. in fours) from ring slot i on, BK
    columns a slot: its first slots' weights, then (the group before done) their rows' boxes and the rest; returns
    the slot after them. box_rows: `_narrow_loads`'."""
    x_desc, w_desc, K, N = _narrow_descs(desc, False, W, ACT, box_rows, e, PROBE)
    pid, P = gl.program_id(0), gl.num_programs(0)
    tiles = gl.cdiv(N, NARROW_BN)
    KC = gl.cdiv(K, BK)  # (a quad's slots; its chunk u: quad u // KC's columns (u % KC) BK)
    chunks = gl.cdiv(gl.maximum(gl.cdiv(tiles - pid, P), 0), QUADS) * KC
    early = gl.minimum(chunks, QUADS_EARLY)
    _released(kv_empty, j, j, ATT_STAGES)  # (attention's slots, over the same bytes, read)
    i0 = i
    for u in range(0, early):
        i = _quad_fill(x_desc, w_desc, a_ring, b_ring, ready, empty, i, pid + (u // KC) * QUADS * P, P, tiles,
                       (u % KC) * BK, K, False, PROBE)
    if not PROBE & 16:
        wait(EVENTS, e - 1, P)
    _clock(EVENTS, events, e, 0, TRACING)
    for u in range(0, early):
        if not PROBE & 1:
            s = (i0 + u) % SK_STAGES
            tma.async_copy_global_to_shared(x_desc, [0, (u % KC) * BK], ready.index(s), a_ring.index(s))
    for u in range(early, chunks):
        i = _quad_fill(x_desc, w_desc, a_ring, b_ring, ready, empty, i, pid + (u // KC) * QUADS * P, P, tiles,
                       (u % KC) * BK, K, True, PROBE)
    return i


@gluon.jit
def _quad_fill(x_desc, w_desc, a_ring, b_ring, ready, empty, i, t, P, tiles, k, K, ROWS: gl.constexpr,
               PROBE: gl.constexpr):
    """`_fill` for a quad: the weight boxes of tiles t, t + P, .. (those below `tiles`) at column k, stacked in the
    slot's [BN, BK] weight view, and (ROWS) the rows' box beside them (none with PROBE & 1: timing only)."""
    boxes: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NARROW_BN, BK], gl.bfloat16)
    ws = b_ring._reinterpret(gl.bfloat16, [SK_STAGES * QUADS, NARROW_BN, BK], boxes)
    s = i % SK_STAGES
    real = gl.minimum(gl.maximum(gl.cdiv(tiles - t, P), 0), QUADS)
    mbarrier.wait(empty.index(s), ((i // SK_STAGES) & 1) ^ 1)
    for r in gl.static_range(1, QUADS + 1):  # (a byte count is a constant: the one for the tiles there)
        mbarrier.expect(ready.index(s), (r * NARROW_BN + (0 if PROBE & 1 else BM)) * BK * 2, pred=real == r)
    for q in gl.static_range(QUADS):
        w_row, w_col = _weight_at(t + q * P, k, K, NARROW_BN, PROBE)
        tma.async_copy_global_to_shared(w_desc, [w_row, w_col], ready.index(s), ws.index(QUADS * s + q),
                                        pred=q < real)
    if ROWS and not PROBE & 1:
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), a_ring.index(s))
    return i + 1


@gluon.jit
def _pair_views(b_ring):
    """The stream-K ring's weight slots as pair tiles' boxes: slot s's unit v at `units.index(8 s + v)` ([2,
    PAIR_ROWS, BK]: the unit's lower halves' rows, then its upper halves'), its first two units as one [4 PAIR_ROWS,
    BK] operand (`two.index(4 s)`), its third as a [2 PAIR_ROWS, BK] one (`one.index(8 s + 2)`): the same bytes
    (128-byte rows swizzled by their address)."""
    UNIT: gl.constexpr = 2 * PAIR_ROWS
    unit_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    two_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * UNIT, BK], gl.bfloat16)
    one_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([UNIT, BK], gl.bfloat16)
    units = b_ring._reinterpret(gl.bfloat16, [SK_STAGES * BN // UNIT, 2, PAIR_ROWS, BK], unit_layout)
    two = b_ring._reinterpret(gl.bfloat16, [SK_STAGES * BN // (2 * UNIT), 2 * UNIT, BK], two_layout)
    one = b_ring._reinterpret(gl.bfloat16, [SK_STAGES * BN // UNIT, UNIT, BK], one_layout)
    return units, two, one


@gluon.jit
def _pair_loads(desc, W, ACT, box_rows, a_ring, b_ring, ready, empty, kv_empty, i, j, EVENTS, e, events,
                TRACING: gl.constexpr, PROBE: gl.constexpr):
    """QKV's pair tile (this program's: units 3 pid ..) from ring slot i on, BK columns a slot (the rows' [BM, BK]
    box in the stream-K ring's rows, the units' boxes at the start of its weights'): its first slots' units, then (the
    group before done) their rows' boxes and the rest; returns the slot after them. box_rows: `_narrow_loads`'."""
    units, _, _ = _pair_views(b_ring)
    unit_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    x_off, K, w_off, N = _gemv_operands(desc, True)
    K64 = K.to(gl.int64)
    x_desc = tma.make_tensor_descriptor(ACT + x_off, [box_rows, K], [K64, 1], [BM, BK], x_layout)
    w_desc = tma.make_tensor_descriptor(W + w_off, [2 * (N // HD), HD // 2, K], [(HD // 2) * K64, K64, 1],
                                        [2, PAIR_ROWS, BK], unit_layout)
    first = gl.program_id(0) * PAIR_UNITS
    chunks = gl.where(first < N // (2 * PAIR_ROWS), gl.cdiv(K, BK), 0)
    early = gl.minimum(chunks, SK_STAGES)
    _released(kv_empty, j, j, ATT_STAGES)  # (attention's slots, over the same bytes, read)
    i0 = i
    for u in range(0, early):
        i = _pair_fill(x_desc, w_desc, a_ring, units, ready, empty, i, first, u * BK, False)
    if not PROBE & 16:
        wait(EVENTS, e - 1, gl.num_programs(0))
    _clock(EVENTS, events, e, 0, TRACING)
    for u in range(0, early):
        s = (i0 + u) % SK_STAGES
        tma.async_copy_global_to_shared(x_desc, [0, u * BK], ready.index(s), a_ring.index(s))
    for u in range(early, chunks):
        i = _pair_fill(x_desc, w_desc, a_ring, units, ready, empty, i, first, u * BK, True)
    return i


@gluon.jit
def _pair_fill(x_desc, w_desc, a_ring, units, ready, empty, i, first, k, ROWS: gl.constexpr):
    """`_fill` for a pair tile: its units' boxes at column k (a unit of head h's pairs d .. d + PAIR_ROWS: [2 h,
    d, k] of the [2 x heads, HD / 2, K] view) and (ROWS) the rows' box beside them."""
    s = i % SK_STAGES
    mbarrier.wait(empty.index(s), ((i // SK_STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), (BM + PAIR_BN) * BK * 2)
    for v in gl.static_range(PAIR_UNITS):
        unit = first + v
        tma.async_copy_global_to_shared(w_desc, [2 * (unit // UNITS_A_HEAD), (unit % UNITS_A_HEAD) * PAIR_ROWS, k],
                                        ready.index(s), units.index(BN // (2 * PAIR_ROWS) * s + v))
    if ROWS:
        tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), a_ring.index(s))
    return i + 1


@gluon.jit
def _attention_loads(desc, KV, kv_plane, kv_rows, I32, kv, kv_ready, kv_empty, control_at, seq_starts_at,
                     context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e, PAGE: gl.constexpr,
                     PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, SPLIT_SLOTS: gl.constexpr,
                     PROBE: gl.constexpr):
    """An attention group's keys and values into `kv` (its ring's slots: a slot's key halves then its value halves)
    from slot j on, items of ITEM_ROWS rows, the older keys before the group before is done (`attention.load_items`);
    returns the slot after them."""
    _, _, H, HKV, layer, _, splits, _, _ = attention.row(desc)
    return attention.load_items(KV, kv_plane, kv_rows, I32, kv, kv, kv_ready, kv_empty, control_at, seq_starts_at,
                                context_lens_at, seq_req_at, req_pages_at, layer, H // HKV, HKV, splits, j, HD,
                                ITEM_ROWS, PAGE, PAGES_PER_SEQ, MAX_SEQS, ATT_STAGES, IDS, SPLIT_SLOTS, 4, 2, EVENTS,
                                e, PROBE)


@gluon.jit
def _attention_items(desc, ACT, F32, I32, kv, kv_ready, kv_empty, queries, control_at, seq_starts_at,
                     context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e, PAGE: gl.constexpr,
                     PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, SPLIT_SLOTS: gl.constexpr,
                     PART_ROWS: gl.constexpr, PROBE: gl.constexpr):
    """`_attention_loads`' items (`attention.consume_decode_items`: q and p^T through `queries`): each one's queries
    once the group before is done, its online softmax over the ring's slots from j on, its outputs or its split's
    partial; returns the slot after them."""
    q_off, out_off, H, HKV, _, scale, splits, part_off, ticket_off = attention.row(desc)
    return attention.consume_decode_items(ACT, F32, I32, kv, kv, kv_ready, kv_empty, queries, control_at,
                                          seq_starts_at, context_lens_at, seq_req_at, req_pages_at, q_off, out_off,
                                          H, HKV, scale, splits, part_off, ticket_off, j, HD, ITEM_ROWS, PAGE,
                                          PAGES_PER_SEQ, MAX_SEQS, ATT_STAGES, SPLIT_SLOTS, PART_ROWS, MAX_SPLITS, 4,
                                          2, EVENTS, e, PROBE)


@gluon.jit
def _word(GROUPS, g):
    """Row g of the table's tiles word (`GluonCoverage.batch_narrow`): 0 stream-K, 1 whole-K tiles of NARROW_BN
    weight rows, 2 (QKV) pair tiles, 3 (gate/up) whole-K tiles of NARROW_BN, QUADS at a time."""
    return gl.load(GROUPS + _ROW * g + 2)


@gluon.jit
def _rows(I32, control_at):
    """The step's rows (a step that decodes: its sequences), as the plan wrote them (`volatile`: a later step's plan
    writes the word again)."""
    return gl.load(I32 + control_at, volatile=True)


@gluon.jit
def _runs(I32, REGIONS, EVENTS):
    """Whether the step just planned is one the loop runs: a step that only decodes, of BM sequences at most (1), or
    not (0: every request has finished, the step prefills, which the host runs, or the host asked the launch to
    stop)."""
    control = I32 + gl.load(REGIONS + step.CONTROL)
    tokens = gl.load(control, volatile=True)
    return ((gl.load(control + 2, volatile=True) == 0) & (tokens == gl.load(control + 1, volatile=True)) &
            (tokens >= 1) & (tokens <= BM) & (gl.load(EVENTS - 1, volatile=True) == 0)).to(gl.int32)


@gluon.jit
def _loader(DESCS, W, ACT, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, steps, REGIONS, control_at,
            seq_starts_at, context_lens_at, seq_req_at, req_pages_at, a_ring, b_ring, kv, ready, empty, kv_ready,
            kv_empty, go, go_bar, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr,
            SPLIT_SLOTS: gl.constexpr, MAX_TOKENS: gl.constexpr, TRACING: gl.constexpr, PROBE: gl.constexpr):
    """Each group's chunks into its ring, step after step: a projection's first slots' weights before the group
    before is done, the rest after it; attention's keys and values before it, but for the slots that hold the step's
    own keys. A step's plan: past its event, whether the loop goes on (as the consumers decided: `chain._handed`),
    and the step's rows."""
    P = gl.num_programs(0)
    events = steps * groups
    num_rows = _rows(I32, control_at)
    plans = gl.to_tensor(0)
    i = gl.to_tensor(0)  # (the stream-K ring's slots)
    j = gl.to_tensor(0)  # (attention's)
    running = gl.to_tensor(1)
    for e in range(events):
        if running != 0:
            kind, desc, unused = _group(DESCS, GROUPS, e % groups)
            if kind == _PLAN:
                wait(EVENTS, e, P)
                running, plans = _handed(go, go_bar, plans)
                num_rows = _rows(I32, control_at)
            elif kind == _ATTENTION:
                _released(empty, i, i, SK_STAGES)  # (the stream-K ring's slots, over the same bytes, read)
                _clock(EVENTS, events, e, 0, TRACING)  # (its items' older keys go in before the event)
                j = _attention_loads(desc, KV, kv_plane, kv_rows, I32, kv, kv_ready, kv_empty, control_at,
                                     seq_starts_at, context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e, PAGE,
                                     PAGES_PER_SEQ, MAX_SEQS, SPLIT_SLOTS, PROBE)
            elif (kind == _QKV) & (_word(GROUPS, e % groups) == 2):  # (QKV in pair tiles)
                i = _pair_loads(desc, W, ACT, gl.maximum(num_rows, gl.minimum(BM, MAX_TOKENS)), a_ring, b_ring,
                                ready, empty, kv_empty, i, j, EVENTS, e, events, TRACING, PROBE)
            elif (kind == _GATED) & (_word(GROUPS, e % groups) == 3):  # (gate/up's narrow tiles in fours)
                i = _quad_loads(desc, W, ACT, gl.maximum(num_rows, gl.minimum(BM, MAX_TOKENS)), a_ring, b_ring, ready,
                                empty, kv_empty, i, j, EVENTS, e, events, TRACING, PROBE)
            elif (kind <= _QKV) & (unused != 0):  # (a narrow group: whole-K tiles)
                i = _narrow_loads(desc, kind == _QKV, W, ACT, gl.maximum(num_rows, gl.minimum(BM, MAX_TOKENS)),
                                  a_ring, b_ring, ready, empty, kv_empty, i, j, EVENTS, e, events, TRACING, PROBE)
            elif (kind <= _QKV) | (kind == _LOGITS):  # (a projection)
                i = _projection_loads(desc, kind, W, ACT, num_rows, a_ring, b_ring, ready, empty, kv_empty, i, j,
                                      EVENTS, e, events, TRACING, PROBE)


@gluon.jit
def _linear(desc, W, ACT, F32, a_ring, b_ring, ready, empty, c_smem, res_bar, num_rows, parts_at, tickets_at, i,
            phase, GATED: gl.constexpr, NORM_F64: gl.constexpr, PROBE: gl.constexpr):
    """A projection's fragments of this program's stream-K range from ring slot i on, each tile it finishes through
    `linear._epilogue`; returns the next slot and the residual barrier's phase. A fragment's residual is asked for
    once its products are done, before the cut tiles' partials are stored and summed (`tiles.finish_fragment`),
    whether or not this program finishes the tile: asked for then, it came after them, a tail of ~12 us a group where
    the finishing program of a tile of four contributors also loaded their partials one at a time (session 67)."""
    OUT: gl.constexpr = c_smem.type.shape[1]
    layout: gl.constexpr = c_smem.type.layout
    K, N, stats_off, eps, res_off, bias_off, out_stats_off = _linear_row(desc, PROBE)
    o_desc, r_desc = linear.outputs(desc, ACT, num_rows, BM, OUT, layout, GATED)
    num_n = gl.cdiv(N, BN)
    c, c1, KC, total, P = streamk_range(1, num_n, K, BK)
    while c < c1:
        t, kc0, kc1 = fragment(c, c1, KC)
        acc, i = _fragment_product(a_ring, b_ring, ready, empty, i, kc0, kc1, K, PROBE)
        linear._residual(r_desc, c_smem, res_bar, 0, t, res_off, OUT)
        if PROBE & 2:  # (timing only: every fragment finishes its tile alone)
            finish = True
        else:
            finish, acc = finish_fragment(acc, t, kc0, kc1, KC, total, P, num_rows, F32, parts_at, tickets_at)
        if finish:
            linear._epilogue(acc, 0, t * BN, num_rows, N, K, W, F32, o_desc, c_smem, res_bar, phase, stats_off, eps,
                             res_off, bias_off, out_stats_off, GATED, NORM_F64)
        elif res_off >= 0:  # (its residual unused: the barrier's phase moves on all the same)
            mbarrier.wait(res_bar.index(0), phase)
        phase ^= (res_off >= 0).to(gl.int32)
        c += kc1 - kc0
    return i, phase


@gluon.jit
def _linear_row(desc, PROBE: gl.constexpr):
    """`linear.row`'s words of a projection's descriptor; PROBE & 128 (timing only), no sums of squares added for
    the norm after (`out_stats_off` -1); PROBE & 256, no residual added (`res_off` -1)."""
    K, N, stats_off, eps, res_off, bias_off, out_stats_off = linear.row(desc)
    if PROBE & 128:
        out_stats_off = gl.minimum(out_stats_off, -1)
    if PROBE & 256:
        res_off = gl.minimum(res_off, -1)
    return K, N, stats_off, eps, res_off, bias_off, out_stats_off


@gluon.jit
def _inv_rms(F32, stats_off, num_rows, K, eps, layout: gl.constexpr, NORM_F64: gl.constexpr):
    """The step's rows' 1/rms from their norm's sums of squares at F32[stats_off], in `layout`'s rows (1 where no
    norm applies: stats_off < 0), as `linear._epilogue` scales them."""
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    sums = gl.load(_norm_sums(F32, gl.maximum(stats_off, 0), NORM_F64) + rows,
                   mask=(rows < num_rows) & (stats_off >= 0), other=1.0).to(gl.float32)
    return gl.where(stats_off >= 0, gl.rsqrt(sums / K.to(gl.float32) + eps), 1.0)


@gluon.jit
def _fragment_product(a_ring, b_ring, ready, empty, i, kc0, kc1, K, PROBE: gl.constexpr):
    """A stream-K fragment's fp32 [BM, BN] products over its chunks kc0 .. kc1 from ring slot i on, and the slot
    after them. PROBE & 4 (timing only): none, each slot released once it is full (`_drained`)."""
    if PROBE & 4:
        acc, i = _drained(ready, empty, i, kc1 - kc0, BN)
    else:
        acc, i = range_product(a_ring, b_ring, ready, empty, i, kc0 * BK, gl.minimum(kc1 * BK, K), SK_STAGES)
    return acc, i


@gluon.jit
def _narrow_linear(desc, W, ACT, F32, a_ring, b_ring, ready, empty, c_smem, res_bar, num_rows, i, phase, EVENTS,
                   events, e, GATED: gl.constexpr, NORM_F64: gl.constexpr, TRACING: gl.constexpr,
                   PROBE: gl.constexpr):
    """A narrow group's tiles (this program's: pid, pid + P, ..) over all of K from ring slot i on, each then
    through `linear._epilogue` (its residual asked for before its products; the rows' 1/rms, where a norm applies,
    once a group); returns the next slot and the residual barrier's phase. TRACING: the time the last tile's
    products were done (`chain._clock`'s word 3)."""
    OUT: gl.constexpr = c_smem.type.shape[1]
    layout: gl.constexpr = c_smem.type.layout
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, NARROW_BN, 16])
    K, N, stats_off, eps, res_off, bias_off, out_stats_off = _linear_row(desc, PROBE)
    o_desc, r_desc = linear.outputs(desc, ACT, num_rows, BM, OUT, layout, GATED)
    inv = _inv_rms(F32, stats_off, num_rows, K, eps, acc_layout, NORM_F64)
    for t in range(gl.program_id(0), gl.cdiv(N, NARROW_BN), gl.num_programs(0)):
        linear._residual(r_desc, c_smem, res_bar, 0, t, res_off, OUT)
        acc, i = _narrow_product(a_ring, b_ring, ready, empty, i, K, PROBE)
        _clock(EVENTS, events, e, 3, TRACING)
        linear._epilogue(acc * inv[:, None], 0, t * NARROW_BN, num_rows, N, K, W, F32, o_desc, c_smem, res_bar,
                         phase, -1, eps, res_off, bias_off, out_stats_off, GATED, NORM_F64)
        phase ^= (res_off >= 0).to(gl.int32)
    return i, phase


@gluon.jit
def _narrow_product(a_ring, b_ring, ready, empty, i, K, PROBE: gl.constexpr):
    """A narrow tile's fp32 [BM, NARROW_BN] products over all of K from ring slot i on; returns them and the next
    tile's slot. PROBE & 4 (timing only): none, each slot released once it is full (`_drained`)."""
    if PROBE & 4:
        acc, i = _drained(ready, empty, i, gl.cdiv(K, NARROW_K), NARROW_BN)
    else:
        acc, i = _narrow_mma(a_ring, b_ring, ready, empty, i, K)
    return acc, i


@gluon.jit
def _drained(ready, empty, i, chunks, BW: gl.constexpr):
    """(timing only) `chunks` ring slots from i on released as soon as they are full, no products: zeros [BM, BW]
    in a product's layout, and the slot after them."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                      instr_shape=[16, BW, 16])
    for _ in range(chunks):
        s = i % SK_STAGES
        mbarrier.wait(ready.index(s), (i // SK_STAGES) & 1)
        mbarrier.arrive(empty.index(s), count=1)
        i += 1
    return gl.zeros([BM, BW], gl.float32, layout), i


@gluon.jit
def _narrow_mma(a_ring, b_ring, ready, empty, i, K):
    """`_narrow_product`'s products. A slot goes back to the loader once the next slot's products are issued and its
    own are done (as soon as its own are done, the next slot's waited for after that: level at 64 rows on the H200,
    5,749 us the 160 groups against 5,720, session 74)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, NARROW_BN, 16])
    xs, ws = _narrow_views(a_ring, b_ring)
    acc = gl.zeros([BM, NARROW_BN], gl.float32, acc_layout)
    for k in range(0, K, NARROW_K):
        s = i % SK_STAGES
        mbarrier.wait(ready.index(s), (i // SK_STAGES) & 1)
        acc = warpgroup_mma(xs.index(2 * s), ws.index(2 * s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(xs.index(2 * s + 1), ws.index(2 * s + 1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc, ))
        # the slot before's products are done: it goes back to the loader
        mbarrier.arrive(empty.index((i + SK_STAGES - 1) % SK_STAGES), count=1, pred=k > 0)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty.index((i + SK_STAGES - 1) % SK_STAGES), count=1)
    return acc, i


@gluon.jit
def _quad_gated(desc, W, ACT, F32, a_ring, b_ring, ready, empty, staging, num_rows, i, EVENTS, events, e,
                NORM_F64: gl.constexpr, TRACING: gl.constexpr, PROBE: gl.constexpr):
    """gate/up's narrow tiles QUADS at a time (`_quad_loads`): each quad's [BM, BN] products over all of K (column
    c: tile pid + (QUADS u + c // NARROW_BN) P's weight row c % NARROW_BN), then `linear._epilogue`'s for a gated
    projection without residual or sums out (the rows' 1/rms, the bias, silu(gate) * up, each rounded as there), its
    [BM, BN / 2] outputs through the staging buffer by a TMA store a tile. Returns the next slot. TRACING: the time the
    last quad's products were done (`chain._clock`'s word 3)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    HALF: gl.constexpr = NARROW_BN // 2  # (a tile's outputs)
    # the staging buffer's first half as each tile's [BM, HALF] outputs one after another, whence one TMA store a
    # tile (stored from registers instead, which Triton wrote as 32 two-byte stores a thread, the group's last
    # epilogue took 4 us longer, H200, session 78)
    out_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    outs = staging._reinterpret(gl.bfloat16, [QUADS, BM, HALF], out_layout)  # (a tile's, `.index(q)`)
    # (the same bytes whole, as the products' columns are: unswizzled, a rank-3 view)
    rows_tiles = staging._reinterpret(gl.bfloat16, [QUADS, BM, HALF],
                                      gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16,
                                                           rank=3)).permute((1, 0, 2))
    K, N, stats_off, eps, _, bias_off, _ = _linear_row(desc, PROBE)
    o_desc = tma.make_tensor_descriptor(ACT + gl.load(desc + linear.WORDS[5]), [num_rows, N // 2],
                                        [gl.load(desc + linear.WORDS[6]), 1], [BM, HALF], out_layout)
    pid, P = gl.program_id(0), gl.num_programs(0)
    inv = _inv_rms(F32, stats_off, num_rows, K, eps, acc_layout, NORM_F64)
    c = gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
    for t in range(pid, gl.cdiv(N, NARROW_BN), QUADS * P):
        if PROBE & 4:
            acc, i = _drained(ready, empty, i, gl.cdiv(K, BK), BN)
        else:
            acc, i = range_product(a_ring, b_ring, ready, empty, i, 0, K, SK_STAGES)
        _clock(EVENTS, events, e, 3, TRACING)
        y = acc * inv[:, None]
        if bias_off >= 0:
            w_rows = (t + (c // NARROW_BN) * P) * NARROW_BN + c % NARROW_BN
            y = y + gl.load(W + _region(bias_off) + w_rows, mask=w_rows < N, other=0.0).to(gl.float32)[None, :]
        y = _round(y)
        gate, up = gl.split(gl.reshape(y, [BM, BN // 2, 2]))
        y = _round(_round(gate / (1.0 + gl.exp(-gate))) * up)
        tma.store_wait(pendings=0)  # (the quad before's stores have read the buffer)
        rows_tiles.store(gl.reshape(y.to(gl.bfloat16), [BM, QUADS, HALF]))
        fence_async_shared()
        for q in gl.static_range(QUADS):  # (a tile past the last: its box past the outputs' end, nothing written)
            tma.async_copy_shared_to_global(o_desc, [0, (t + q * P) * HALF], outs.index(q))
    return i


@gluon.jit
def _narrow_qkv(desc, W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, num_rows, positions_at, slots_at,
                parts_at, tickets_at, i, EVENTS, events, e, NORM_F64: gl.constexpr, TRACING: gl.constexpr,
                PROBE: gl.constexpr):
    """QKV in whole-K tiles of NARROW_BN (this program's: pid, pid + P, ..), each tile's values (1/rms, bias, rounded
    to bf16, as `_prefill_epilogue`) into a bf16 scratch of the step's [rows, heads x HD] at F32[parts_at], then its
    head's ticket at F32[tickets_at + head]; the tile that completes a head (the last of its HD / NARROW_BN) reads the
    head back and runs `qkv._store_head` (q/k norm, rotary, q or the paged cache) for it, as the one-row GEMV's
    units do (`gemv.qkv_units`). Returns the next slot. TRACING: the time each tile's products were done, the last
    tile's kept (`chain._clock`'s word 3)."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, NARROW_BN, 16])
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    HALF: gl.constexpr = HD // 2
    PER_HEAD: gl.constexpr = HD // NARROW_BN
    K, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, \
        step_kv_off = qkv.row(desc)
    heads = HQ + 2 * HKV
    N = heads * HD
    scratch = (F32 + _region(parts_at)).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, acc_layout))
    sums = qkv._row_sums(0, num_rows, F32, stats_off, acc_layout, NORM_F64, BM)
    for t in range(gl.program_id(0), gl.cdiv(N, NARROW_BN), gl.num_programs(0)):
        acc, i = _narrow_product(a_ring, b_ring, ready, empty, i, K, PROBE)
        _clock(EVENTS, events, e, 3, TRACING)
        y = qkv._scaled(acc, t, sums, K, eps, stats_off, bias_off, W, heads, HD).to(gl.bfloat16)
        cols = t * NARROW_BN + gl.arange(0, NARROW_BN, layout=gl.SliceLayout(0, acc_layout))
        gl.store(scratch + rows[:, None] * N + cols[None, :], y, mask=(rows < num_rows)[:, None])
        gl.thread_barrier()  # every thread's values stored before the ticket publishes them
        head = t // PER_HEAD
        arrived = gl.atomic_add(F32 + tickets_at + head, 1.0, sem="acq_rel")
        gl.thread_barrier()
        if arrived == PER_HEAD - 1:
            gl.store(F32 + tickets_at + head, 0.0)  # (for the group after)
            hrows = gl.arange(0, BM, layout=gl.SliceLayout(1, half))
            j = gl.arange(0, HALF, layout=gl.SliceLayout(0, half))
            mask = (hrows < num_rows)[:, None] & (j < HALF)[None, :]
            at = scratch + hrows[:, None] * N + head * HD + j[None, :]
            lo = gl.load(at, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
            hi = gl.load(at + HALF, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
            pos, slot = qkv._row_words(hrows, hrows < num_rows, I32, positions_at, slots_at)
            angles = F32 + _region(rope_off) + pos[:, None] * HD + j[None, :]
            pos_cos = _round(gl.load(angles, mask=mask, other=0.0))
            pos_sin = _round(gl.load(angles + HALF, mask=mask, other=0.0))
            qkv._store_head(lo, hi, head, hrows, j, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV,
                            q_norm_off, k_norm_off, qk_eps, q_out_off, layer, has_qk_norm, step_kv_off, slot, HD)
    return i


@gluon.jit
def _pair_qkv(desc, W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, staging, num_rows, positions_at,
              slots_at, i, EVENTS, events, e, NORM_F64: gl.constexpr, TRACING: gl.constexpr):
    """QKV in pair tiles (`_pair_loads`), this program's one: the products of its first two units and of its third
    in two accumulators; each unit's 1/rms, bias and rounding to bf16 (`qkv._scaled`); through the staging buffer
    (its first [BM, 8 PAIR_ROWS], unswizzled) each unit's two halves into one layout; then `qkv._store_head`'s rotary
    and stores for them (no q/k norm: `GluonCoverage.batch_narrow` gives pair tiles to QKV groups without it). Returns
    the next slot. TRACING: the time its products were done (`chain._clock`'s word 3)."""
    UNIT: gl.constexpr = 2 * PAIR_ROWS
    two_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, 2 * UNIT, 16])
    one_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, UNIT, 16])
    unit_rows: gl.constexpr = gl.BlockedLayout([1, 4], [16, 2], [gl.num_warps(), 1], [1, 0])  # ([BM, PAIR_ROWS])
    K, HQ, HKV, stats_off, eps, bias_off, _, _, _, q_out_off, layer, rope_off, _, step_kv_off = qkv.row(desc)
    units_total = (HQ + 2 * HKV) * UNITS_A_HEAD
    # (0, opaque to the compiler: what derives from it is worked out here, not hoisted out of the loop over groups,
    # where its registers made the kernel spill 536 B rather than 352; times 8, so that the units' columns stay
    # known to be multiples of 8 and their stores 8 bytes wide)
    zero = gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False,
                                     pack=1) * 8
    first = gl.program_id(0) * PAIR_UNITS + zero
    if first < units_total:
        _boxes, two, one = _pair_views(b_ring)  # (the products read the views of two units and of one)
        stage = staging._reinterpret(gl.bfloat16, [BM, 8 * PAIR_ROWS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        sums2 = qkv._row_sums(0, num_rows, F32, stats_off, two_layout, NORM_F64, BM)
        sums1 = qkv._row_sums(0, num_rows, F32, stats_off, one_layout, NORM_F64, BM)
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, unit_rows)) + zero
        pos, slot = qkv._row_words(rows, rows < num_rows, I32, positions_at, slots_at)
        # every unit's cos and sin asked for before the products (from DRAM, likely: after a step's weights and keys
        # the table has left L2; asked for after them, one unit's after another's stores, the epilogue took 5.9 us
        # on the H200, all at once 5.2, session 74)
        rows_ok = rows < num_rows
        j0, m0, cos0, sin0 = _unit_angles(F32, rope_off, pos, rows_ok, first, units_total, zero, unit_rows)
        j1, m1, cos1, sin1 = _unit_angles(F32, rope_off, pos, rows_ok, first + 1, units_total, zero, unit_rows)
        j2, m2, cos2, sin2 = _unit_angles(F32, rope_off, pos, rows_ok, first + 2, units_total, zero, unit_rows)
        acc2 = gl.zeros([BM, 2 * UNIT], gl.float32, two_layout)
        acc1 = gl.zeros([BM, UNIT], gl.float32, one_layout)
        for k in range(0, K, BK):
            s = i % SK_STAGES
            mbarrier.wait(ready.index(s), (i // SK_STAGES) & 1)
            acc2 = warpgroup_mma(a_ring.index(s), two.index(BN // (2 * UNIT) * s).permute((1, 0)), acc2,
                                 is_async=True)
            acc1 = warpgroup_mma(a_ring.index(s), one.index(BN // UNIT * s + 2).permute((1, 0)), acc1,
                                 is_async=True)
            acc2, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc2, acc1))
            # the slot before's products are done: it goes back to the loader
            mbarrier.arrive(empty.index((i + SK_STAGES - 1) % SK_STAGES), count=1, pred=k > 0)
            i += 1
        acc2, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc2, acc1))
        mbarrier.arrive(empty.index((i + SK_STAGES - 1) % SK_STAGES), count=1)
        _clock(EVENTS, events, e, 3, TRACING)
        stage.slice(0, 2 * UNIT, dim=1).store(
            qkv._scaled(acc2, first, sums2, K, eps, stats_off, bias_off, W, HQ + 2 * HKV, HD,
                        PAIR_ROWS).to(gl.bfloat16))
        stage.slice(2 * UNIT, UNIT, dim=1).store(
            qkv._scaled(acc1, first + 2, sums1, K, eps, stats_off, bias_off, W, HQ + 2 * HKV, HD,
                        PAIR_ROWS).to(gl.bfloat16))
        gl.thread_barrier()  # every warp's values in before any reads them in the units' layout
        _unit_store(stage, 0, first, rows, j0, m0, cos0, sin0, W, ACT, KV, kv_plane, HQ, HKV, q_out_off, layer,
                    step_kv_off, slot, unit_rows)
        _unit_store(stage, 1, first + 1, rows, j1, m1, cos1, sin1, W, ACT, KV, kv_plane, HQ, HKV, q_out_off, layer,
                    step_kv_off, slot, unit_rows)
        _unit_store(stage, 2, first + 2, rows, j2, m2, cos2, sin2, W, ACT, KV, kv_plane, HQ, HKV, q_out_off, layer,
                    step_kv_off, slot, unit_rows)
        gl.thread_barrier()  # every read done before the staging buffer is written again
    return i


@gluon.jit
def _unit_angles(F32, rope_off, pos, rows_ok, unit, units_total, zero, layout: gl.constexpr):
    """A pair tile's unit's dimensions (its pairs' in a head's lower half), its mask (none past the last unit) and
    each row's cos and sin of them at its position, rounded."""
    j = (unit % UNITS_A_HEAD) * PAIR_ROWS + zero + gl.arange(0, PAIR_ROWS, layout=gl.SliceLayout(0, layout))
    mask = rows_ok[:, None] & ((j < HD // 2) & (unit < units_total))[None, :]
    angles = F32 + _region(rope_off) + pos[:, None] * HD + j[None, :]
    return j, mask, _round(gl.load(angles, mask=mask, other=0.0)), \
        _round(gl.load(angles + HD // 2, mask=mask, other=0.0))


@gluon.jit
def _unit_store(stage, v: gl.constexpr, unit, rows, j, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV,
                q_out_off, layer, step_kv_off, slot, layout: gl.constexpr):
    """Unit v of a pair tile (its values in `stage`'s columns v 2 PAIR_ROWS .., the lower halves' then the upper
    halves'): `qkv._store_head`'s rotary and stores (no q/k norm)."""
    lo = stage.slice(v * 2 * PAIR_ROWS, PAIR_ROWS, dim=1).load(layout).to(gl.float32)
    hi = stage.slice(v * 2 * PAIR_ROWS + PAIR_ROWS, PAIR_ROWS, dim=1).load(layout).to(gl.float32)
    qkv._store_head(lo, hi, unit // UNITS_A_HEAD, rows, j, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV, 0,
                    0, 0.0, q_out_off, layer, 0, step_kv_off, slot, HD)


@gluon.jit
def _qkv(desc, W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_rows, positions_at, slots_at,
         parts_at, tickets_at, i, NORM_F64: gl.constexpr, PROBE: gl.constexpr):
    """QKV's fragments of this program's stream-K range from ring slot i on (a tile a head), each head it finishes
    through `qkv._tile_epilogue` (1/rms, bias, q/k norm, rotary, q or the paged cache); returns the next slot."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    K, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, \
        step_kv_off = qkv.row(desc)
    num_n = gl.cdiv((HQ + 2 * HKV) * HD, BN)
    c, c1, KC, total, P = streamk_range(1, num_n, K, BK)
    while c < c1:
        t, kc0, kc1 = fragment(c, c1, KC)
        acc, i = _fragment_product(a_ring, b_ring, ready, empty, i, kc0, kc1, K, PROBE)
        if PROBE & 2:  # (timing only: every fragment finishes its tile alone)
            finish = True
        else:
            finish, acc = finish_fragment(acc, t, kc0, kc1, KC, total, P, num_rows, F32, parts_at, tickets_at)
        c += kc1 - kc0
        if finish:
            sums, rows, pos, slot = qkv._rows_of(0, num_rows, F32, I32, stats_off, positions_at, slots_at,
                                                 acc_layout, half, NORM_F64, BM)
            qkv._tile_epilogue(acc, t, sums, rows, pos, slot, stage, num_rows, K, stats_off, eps, bias_off, HQ, HKV,
                               q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off,
                               W, ACT, F32, KV, kv_plane, HD)
    return i


@gluon.jit
def _logits(desc, W, F32, a_ring, b_ring, ready, empty, num_rows, parts_at, i, NORM_F64: gl.constexpr,
            GREEDY: gl.constexpr):
    """The LM head's whole tiles pid, pid + P, .. from ring slot i on (`_chunks`), each tile's fp32 logits
    (`kept_epilogue` for OUT_F32: 1/rms, the bias, a rounding to bf16) stored; returns the next slot. GREEDY: each
    row's largest logit of the tile and its first token too, for `_greedy` (`_maxima`)."""
    _, K, _, N, out_off, stats_off, eps, _, bias_off, _ = gemv.linear_row(desc)
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, acc_layout))
    inv = _inv_rms(F32, stats_off, num_rows, K, eps, acc_layout, NORM_F64)
    tiles = gl.cdiv(N, BN)
    for t in range(gl.program_id(0), tiles, gl.num_programs(0)):
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, SK_STAGES)
        cols = t * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
        bias = gl.load(W + _region(gl.maximum(bias_off, 0)) + cols, mask=(cols < N) & (bias_off >= 0), other=0.0)
        y = _round(acc * inv[:, None] + bias.to(gl.float32)[None, :])
        gl.store(F32 + out_off + rows.to(gl.int64)[:, None] * N + cols[None, :], y,
                 mask=(rows < num_rows)[:, None] & (cols < N)[None, :])
        if GREEDY:
            y = gl.where((cols < N)[None, :], y, float("-inf"))
            top, first = gl.reduce((y, gl.zeros_like(y).to(gl.int32) + cols[None, :]), 1, _first_max)
            maxima = _maxima(F32, parts_at) + rows * (2 * tiles) + t
            gl.store(maxima, top, mask=rows < num_rows)
            gl.store(maxima + tiles, first.to(gl.float32), mask=rows < num_rows)
    return i


@gluon.jit
def _first_max(a, i, b, j):
    """The larger of two (logit, token) pairs, the earlier token's of a tie (torch.argmax's)."""
    left = (a > b) | ((a == b) & (i < j))
    return gl.where(left, a, b), gl.where(left, i, j)


@gluon.jit
def _maxima(F32, parts_at):
    """Where the LM head's tiles leave each row's largest logit and its token for greedy sampling: the stream-K
    scratch (free from the LM head to the next step's first projection), a row's `tiles` maxima then their tokens
    (`GluonCoverage.loop_rows` checks the room)."""
    return F32 + _region(parts_at)


@gluon.jit
def _greedy(desc, I32, F32, REGIONS, num_seqs, parts_at, MAX_NEW: gl.constexpr):
    """Greedy sampling as the LM head's epilogue left it (`_logits` with GREEDY): each sequence (the programs in
    turn) takes the first largest of its tiles' maxima, whose token is its first largest logit (torch.argmax's),
    and emits it. Where `step.sample` read a b64 step's 32 MB of logits (81 us), this reads 8 KB a sequence."""
    flat: gl.constexpr = gl.BlockedLayout([8], [32], [gl.num_warps()], [0])
    BLOCK: gl.constexpr = 8 * 32 * gl.num_warps()
    tiles = gl.cdiv(gl.load(desc + 1).to(gl.int32), BN)
    for b in range(gl.program_id(0), num_seqs, gl.num_programs(0)):
        if gl.load(I32 + step._at(REGIONS, step.SEQ_FINAL) + b) == 1:
            maxima = _maxima(F32, parts_at) + b * (2 * tiles)
            top = gl.to_tensor(float("-inf"))
            token = gl.to_tensor(0)
            for t0 in range(0, tiles, BLOCK):
                t = t0 + gl.arange(0, BLOCK, layout=flat)
                values = gl.load(maxima + t, mask=t < tiles, other=float("-inf"), cache_modifier=".cg")
                m = gl.max(values, axis=0)
                if m > top:  # (a later block's tie loses: its tokens come after)
                    top = m
                    first = gl.min(gl.where(values == m, t, 2147483647), axis=0)
                    token = gl.load(maxima + tiles + first, cache_modifier=".cg").to(gl.int32)
            step.emit(I32, REGIONS, gl.load(I32 + step._at(REGIONS, step.SEQ_REQ) + b), token, MAX_NEW)


@gluon.jit
def _consumer(DESCS, W, ACT, F32, I32, KV, kv_plane, GROUPS, EVENTS, groups, steps, first_step, REGIONS, stats_off,
              stats_size, control_at, positions_at, slots_at, seq_starts_at, context_lens_at, seq_req_at,
              req_pages_at, parts_at, tickets_at, a_ring, b_ring, kv, ready, empty, kv_ready, kv_empty, staging,
              res_bar, go, go_bar, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr,
              NORM_F64: gl.constexpr, PART_ROWS: gl.constexpr, SPLIT_SLOTS: gl.constexpr, MAX_TOKENS: gl.constexpr,
              REQS: gl.constexpr, STEP_LOG: gl.constexpr, VB: gl.constexpr, WB: gl.constexpr,
              MAX_NEW: gl.constexpr, SAMPLING: gl.constexpr, TRACING: gl.constexpr, PROBE: gl.constexpr):
    """Each group's fragments, tiles, items or rows once the group before is done (what they read, it wrote), then
    the group's signal, step after step; a step's plan by program 0, then (its event) whether the loop goes on."""
    plain: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    gated: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN // 2], gl.bfloat16)
    outputs = staging._reinterpret(gl.bfloat16, [BM, BN], plain)
    gated_outputs = staging._reinterpret(gl.bfloat16, [BM, BN // 2], gated)
    narrow: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, NARROW_BN], gl.bfloat16)
    narrow_outputs = staging._reinterpret(gl.bfloat16, [BM, NARROW_BN], narrow)
    narrow_gated: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, NARROW_BN // 2], gl.bfloat16)
    narrow_gated_outputs = staging._reinterpret(gl.bfloat16, [BM, NARROW_BN // 2], narrow_gated)
    # (QKV's heads: 16-byte units swizzled by the row, `qkv.qkv_prefill`'s staging)
    heads = staging._reinterpret(gl.bfloat16, [BM, BN], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    # (attention's q halves and p^T: `attention.consume_decode_items`)
    items: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ITEM_ROWS, HD // 2], gl.bfloat16)
    queries = staging._reinterpret(gl.bfloat16, [BM * BN // (ITEM_ROWS * HD // 2), ITEM_ROWS, HD // 2], items)
    num_rows = _rows(I32, control_at)
    P = gl.num_programs(0)
    i = gl.to_tensor(0)  # (the stream-K ring's slots)
    j = gl.to_tensor(0)  # (attention's)
    phase = gl.to_tensor(0)
    running = gl.to_tensor(1)
    for e in range(steps * groups):
        if running != 0:
            # (the arguments' pointers offset by an opaque zero: what a body derives from them is worked out in the
            # loop, not hoisted out of it into registers that the whole loop then holds, or spills. With the loader
            # at 128 registers: 376 -> 232 B of spills, 311 -> 144 spill instructions; a b64 step's attention 41.9 ->
            # 39.6 us a layer, o_proj 15.2 -> 14.6, QKV's last program 1.4 us later; the 160 groups 5,648 -> 5,636,
            # H200, session 77. A multiple of 8, so that the pointers' 16 bytes of alignment stay known: an opaque
            # 0 alone left every global access in the bodies one element wide, none of 16 bytes; QKV's epilogue
            # 4.6 -> 2.6 us, the 160 groups 5,516-5,609 -> 5,443 (other leases of the same H200 pool), session 78)
            zero = gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r,r", [e], dtype=gl.int32, is_pure=False, pack=1) * 8
            DESCS_, W_, ACT_, F32_, I32_, KV_ = DESCS + zero, W + zero, ACT + zero, F32 + zero, I32 + zero, KV + zero
            kind, desc, unused = _group(DESCS_, GROUPS, e % groups)
            if kind == _ATTENTION:
                j = _attention_items(desc, ACT_, F32_, I32_, kv, kv_ready, kv_empty, queries, control_at,
                                     seq_starts_at, context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e, PAGE,
                                     PAGES_PER_SEQ, MAX_SEQS, SPLIT_SLOTS, PART_ROWS, PROBE)
            else:
                if not PROBE & 16:
                    wait(EVENTS, e - 1, P)
                _clock(EVENTS, steps * groups, e, 2, TRACING)
                if (kind == _QKV) & (_word(GROUPS, e % groups) == 2):
                    i = _pair_qkv(desc, W_, ACT_, F32_, I32_, KV_, kv_plane, a_ring, b_ring, ready, empty, heads,
                                  num_rows, positions_at, slots_at, i, EVENTS, steps * groups, e, NORM_F64, TRACING)
                elif (kind == _QKV) & (unused != 0):
                    i = _narrow_qkv(desc, W_, ACT_, F32_, I32_, KV_, kv_plane, a_ring, b_ring, ready, empty, num_rows,
                                    positions_at, slots_at, parts_at, tickets_at, i, EVENTS, steps * groups, e,
                                    NORM_F64, TRACING, PROBE)
                elif kind == _QKV:
                    i = _qkv(desc, W_, ACT_, F32_, I32_, KV_, kv_plane, a_ring, b_ring, ready, empty, heads, num_rows,
                             positions_at, slots_at, parts_at, tickets_at, i, NORM_F64, PROBE)
                elif (kind == _GATED) & (_word(GROUPS, e % groups) == 3):
                    i = _quad_gated(desc, W_, ACT_, F32_, a_ring, b_ring, ready, empty, staging, num_rows, i, EVENTS,
                                    steps * groups, e, NORM_F64, TRACING, PROBE)
                elif (kind == _GATED) & (unused != 0):
                    i, phase = _narrow_linear(desc, W_, ACT_, F32_, a_ring, b_ring, ready, empty, narrow_gated_outputs,
                                              res_bar, num_rows, i, phase, EVENTS, steps * groups, e, True, NORM_F64,
                                              TRACING, PROBE)
                elif kind == _GATED:
                    i, phase = _linear(desc, W_, ACT_, F32_, a_ring, b_ring, ready, empty, gated_outputs, res_bar,
                                       num_rows, parts_at, tickets_at, i, phase, True, NORM_F64, PROBE)
                elif (kind == _PLAIN) & (unused != 0):
                    i, phase = _narrow_linear(desc, W_, ACT_, F32_, a_ring, b_ring, ready, empty, narrow_outputs,
                                              res_bar, num_rows, i, phase, EVENTS, steps * groups, e, False, NORM_F64,
                                              TRACING, PROBE)
                elif kind == _PLAIN:
                    i, phase = _linear(desc, W_, ACT_, F32_, a_ring, b_ring, ready, empty, outputs, res_bar, num_rows,
                                       parts_at, tickets_at, i, phase, False, NORM_F64, PROBE)
                elif kind == _LOGITS:
                    i = _logits(desc, W_, F32_, a_ring, b_ring, ready, empty, num_rows, parts_at, i, NORM_F64,
                                not SAMPLING)
                elif kind == _SAMPLE:
                    if SAMPLING:  # (temperatures: draws over the logits)
                        step.sample(desc, I32_, F32_, REGIONS, num_rows, VB, WB, MAX_NEW, SAMPLING)
                    else:
                        _greedy(desc, I32_, F32_, REGIONS, num_rows, parts_at, MAX_NEW)
                else:  # a step's rows around its layers (`step.py`)
                    _step_group(kind, desc, W_, ACT_, F32_, I32_, REGIONS, first_step + e // groups, stats_off,
                                stats_size, num_rows, PAGES_PER_SEQ, PAGE, MAX_TOKENS, REQS, STEP_LOG, VB, WB,
                                MAX_NEW, SAMPLING, NORM_F64, False)
            _signal(EVENTS, e)
            _clock(EVENTS, steps * groups, e, 1, TRACING)
            if kind == _PLAN:
                wait(EVENTS, e, P)
                running = _runs(I32_, REGIONS, EVENTS)
                num_rows = _rows(I32_, control_at)
                _hand(go, go_bar, running)


@gluon.jit
def batch_chain(DESCS, W, ACT, F32, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, control_at, positions_at,
                slots_at, seq_starts_at, context_lens_at, seq_req_at, req_pages_at, parts_at, tickets_at, steps,
                first_step, REGIONS, stats_off, stats_size, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr,
                MAX_SEQS: gl.constexpr, NORM_F64: gl.constexpr, PART_ROWS: gl.constexpr, LOADER_REGS: gl.constexpr,
                SPLIT_SLOTS: gl.constexpr = 1, MAX_TOKENS: gl.constexpr = 1, REQS: gl.constexpr = 32,
                STEP_LOG: gl.constexpr = 4096, VB: gl.constexpr = 1024, WB: gl.constexpr = 4096,
                MAX_NEW: gl.constexpr = 1, SAMPLING: gl.constexpr = False, TRACING: gl.constexpr = False,
                PROBE: gl.constexpr = 0):
    """`chain.decode_chain`'s for steps that only decode, of 1 to BM rows (I32[control_at]): the `groups` rows of
    GROUPS (kind, descriptor row, narrow: a PLAIN group in whole-K tiles of NARROW_BN, one a program), `steps` times
    over (group g of step s at EVENTS[s groups + g]): the
    projections (PLAIN, GATED, QKV) stream-K (their cut tiles' partials and tickets at F32[parts_at] and
    F32[tickets_at]: `prefill_parts` and `tickets:prefill`), attention in decode items (split where the pairs are
    fewer than the programs, in slots of SPLIT_SLOTS x 64 keys at least), and where the table has them a step's plan
    (its first group: the loop stops at a plan that leaves no step it takes), embedding, the rows that need logits,
    the LM head (LOGITS, whole tiles) and sampling, as `decode_chain` has them (`step.py`; the constexprs after
    SPLIT_SLOTS are its). EVENTS: a counter a group a step, zero at the launch. One program an SM, each waiting for
    all of them. TRACING: the times of each group's event (its loader past the event before) and of each program's
    signal after the counters, as `decode_chain` has them (`chain._clock`). PROBE (timing only, the outputs wrong: 0
    in use): 1, the step's rows never copied (a narrow group's too), a slot waiting for its weights alone; 2, no
    fragment waits for the others of its tile (each finishes it alone), to see what the rows' copies and the
    partials' exchange cost; 4, no products (a projection's slots released as soon as they are full, `_drained`), to
    see whether its consumers or its bytes bound a group; 8, the weights read as if laid out tile after tile
    (`_tiled`), a box's bytes contiguous: what their layout costs the stream; 16, no projection waits for the group
    before (attention still does; with 2, no fragment for a ticket either): what the groups' barriers cost; 32,
    attention's items without products (each slot of keys released once full), to see whether its consumers or its
    bytes bound it; 64, the keys and values read as if a page's KV heads were laid out one after the other (a box's
    2 KB contiguous: `attention.load_items`), what the cache's layout costs attention's stream; 128, no sums of
    squares added after a projection for the norm after it, and 256, no residual added (`_linear_row`), what a
    projection's epilogue costs. (Weights
    asked into L2 ahead of the copies did not pay: a group's first 64 KB a program took o_proj at 64 rows from 17.8 to
    14.4 us but held gate/up's loader 2 us, session 69; kept 32, 64 or 128 KB ahead all through a group, 2c83014, the
    step took 3.2, 2.0, 1.5x as long, session 70.)"""
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    halves: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HD // 2], gl.bfloat16)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [SK_STAGES, BM, BK], x_layout)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [SK_STAGES, BN, BK], w_layout)
    kv = b_ring._reinterpret(gl.bfloat16, [4 * ATT_STAGES, KEYS, HD // 2], halves)
    ready, empty = _barriers(SK_STAGES)
    kv_ready, kv_empty = _barriers(ATT_STAGES)
    staging = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], gl.NVMMASharedLayout.get_default_for([BM, BN],
                                                                                                    gl.bfloat16))
    res_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(res_bar.index(0), count=1)
    go, go_bar = _go()
    gl.warp_specialize([
        (_consumer, (DESCS, W, ACT, F32, I32, KV, kv_plane, GROUPS, EVENTS, groups, steps, first_step, REGIONS,
                     stats_off, stats_size, control_at, positions_at, slots_at, seq_starts_at, context_lens_at,
                     seq_req_at, req_pages_at, parts_at, tickets_at, a_ring, b_ring, kv, ready, empty, kv_ready,
                     kv_empty, staging, res_bar, go, go_bar, PAGE, PAGES_PER_SEQ, MAX_SEQS, NORM_F64, PART_ROWS,
                     SPLIT_SLOTS, MAX_TOKENS, REQS, STEP_LOG, VB, WB, MAX_NEW, SAMPLING, TRACING, PROBE)),
        (_loader, (DESCS, W, ACT, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, steps, REGIONS, control_at,
                   seq_starts_at, context_lens_at, seq_req_at, req_pages_at, a_ring, b_ring, kv, ready, empty,
                   kv_ready, kv_empty, go, go_bar, PAGE, PAGES_PER_SEQ, MAX_SEQS, SPLIT_SLOTS, MAX_TOKENS, TRACING,
                   PROBE)),
    ], [1], [LOADER_REGS])


def constexprs(page_size: int, pages_per_seq: int, max_batch: int, norm_f64: bool, part_rows: int,
               split_slots: int = 1, max_tokens: int = 1, sample_block: int = 1024, max_new: int = 1,
               sample_wide: int = 4096, sampling: bool = False) -> dict:
    """`batch_chain`'s constexprs: the step's paging, the sums' type, a split's partial rows
    (`CompileConfig.block_m`) and slots of keys at least; for a loop over steps, `chain.decode_constexprs`' (the
    plan's token budget, the sampler's block, the requests' output room, the cut's passes, temperatures or not)."""
    lanes = max(32, 1 << (max_batch - 1).bit_length())
    return dict(PAGE=page_size, PAGES_PER_SEQ=pages_per_seq, MAX_SEQS=lanes, NORM_F64=norm_f64, PART_ROWS=part_rows,
                LOADER_REGS=LOADER_REGS, SPLIT_SLOTS=split_slots, MAX_TOKENS=max_tokens, REQS=lanes,
                STEP_LOG=STEP_LOG, VB=sample_block, WB=sample_wide, MAX_NEW=max_new, SAMPLING=sampling,
                TRACING=False, PROBE=0)
