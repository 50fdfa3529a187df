"""The QKV projection's prefill in Gluon: every (row block, head) tile of a QKV group, with its epilogue.

It computes what the group's Triton tasks compute in a step that prefills (codegen/bodies/qkv.py, `qkv_prefill` and
`head_epilogue`), from the same descriptor row (`QKV_FIELDS`): the input rows times the placed weight (the norm's
weight folded in), each row scaled by 1/rms from its producer's sums of squares, the bias, a rounding to bf16; for q
and k heads the per-head RMSNorm (Qwen3's q_norm and k_norm) and the rotary embedding at each token's position, every
step rounded as the Triton body rounds it; then q heads to the activation rows attention reads, k and v heads to the
paged cache at each token's slot (and to the step's rows with `attention_step_keys`).

The tiles are [128, head_dim] or [128, 2 head_dim] (one head a column block or two, `linear.tiles_for` picks as for
the projections), multiplied as the projections' are (codegen/gluon/tiles.py). The rows' sums, positions and slots
are asked for before a tile's products, each position's cos and sin right after them. The epilogue takes the heads'
values through shared memory so that each row's two halves (rotary pairs column j with j + head_dim / 2) come back in
one layout, and stores by pointers: a q row and a cache row are each one contiguous head. Heads of 128 dimensions with
rotary over all of them (Llama-3, Qwen3, Phi-4); others stay with the Triton body.

H200, Llama-3-8B's first step in the host-driven executor (`benchmarks/gluon_groups.py`, 32 layers): session 60, one
head a tile, the rows' words read after the products: 6,483 us at 2,048 tokens against the Triton groups' 5,925;
session 61, two heads a tile where the wide tiles pay: 6,290 against 5,811 (bit for bit with the Triton body), and
with the staging buffer swizzled (ncu: the unswizzled one's stores from the products' layout were 193-way bank
conflicts) 6,189 against 5,915, at 512 tokens 2,171 against 2,154; then with the epilogue's accesses 16 bytes wide
(its offsets said to be regions', `linear._region`: every store and cos/sin load had been 2 or 4 bytes) and one-head
tiles' epilogue in a partition of its own: at 2,048 tokens two heads a tile 4,760 against 5,920 (one head a tile with
the partition 5,050), at 512 one head a tile 1,865 against 2,152.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from codegen.bodies.qkv import QKV_FIELDS
from codegen.gluon.linear import ALIGN, CONSUMER_WARPS as LINEAR_WARPS, LOADER_REGS, Tiles
from codegen.gluon.linear import _norm_sums, _region, _round
from codegen.gluon.tiles import operands, ring, streamk_loader, streamk_range, streamk_step, tile_at, tile_loader
from codegen.gluon.tiles import tile_product
from codegen.tasks import DESC_WORDS

USED = ("x_off", "k", "w_off", "num_q_heads", "num_kv_heads", "head_dim", "stats_off", "eps", "bias_off",
        "q_norm_off", "k_norm_off", "qk_eps", "q_out_off", "layer", "rope_off", "has_qk_norm", "step_kv_off")
WORDS = gl.constexpr(tuple(QKV_FIELDS.index(f) for f in USED))
BK = gl.constexpr(64)  # a chunk's columns of K (a tile's rows: `Tiles.bm`)
HEAD_DIM = 128

SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "KV": "*bf16",
             "kv_plane": "i64", "desc_index": "i32", "tokens_at": "i32", "positions_at": "i32", "slots_at": "i32",
             "parts_at": "i64", "tickets_at": "i64"}


@gluon.jit
def _row_sums(m0, num_rows, F32, stats_off, layout: gl.constexpr, NORM_F64: gl.constexpr, BM: gl.constexpr):
    """The sums of squares of rows m0 .. m0 + BM (1 where no norm applies), in `layout`'s rows: asked for before a
    tile's products, which they do not depend on."""
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    return gl.load(_norm_sums(F32, gl.maximum(stats_off, 0), NORM_F64) + rows,
                   mask=(rows < num_rows) & (stats_off >= 0), other=1.0).to(gl.float32)


@gluon.jit
def _row_words(rows, row_ok, I32, positions_at, slots_at):
    """The rows' positions and cache slots."""
    pos = gl.load(I32 + positions_at + rows, mask=row_ok, other=0)
    slot = gl.load(I32 + slots_at + rows, mask=row_ok, other=0)
    return pos, slot


@gluon.jit
def _scaled(acc, n, sums, K, eps, stats_off, bias_off, W, num_heads, HD: gl.constexpr, PAIR_ROWS: gl.constexpr = 0):
    """A tile's products (weight rows n BN ..) times each row's 1/rms, plus the bias: `_prefill_epilogue`'s part
    before the rounding. PAIR_ROWS: a batched decode step's pair tile (`batch._pair_qkv`), whose columns are units
    n .. of PAIR_ROWS rotary pairs of one head each (a unit's lower halves' weight rows, then its upper halves')."""
    BN: gl.constexpr = acc.type.shape[1]
    if stats_off >= 0:
        acc = acc * gl.rsqrt(sums / K.to(gl.float32) + eps)[:, None]
    if bias_off >= 0:
        c = gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
        if PAIR_ROWS:
            UNITS_A_HEAD: gl.constexpr = HD // (2 * PAIR_ROWS)
            unit = n + c // (2 * PAIR_ROWS)
            rows = (unit // UNITS_A_HEAD) * HD + (c // PAIR_ROWS) % 2 * (HD // 2) + \
                (unit % UNITS_A_HEAD) * PAIR_ROWS + c % PAIR_ROWS
        else:
            rows = n * BN + c
        acc = acc + gl.load(W + _region(bias_off) + rows, mask=rows < num_heads * HD,
                            other=0.0).to(gl.float32)[None, :]
    return acc


@gluon.jit
def _store_head(lo, hi, head, rows, j, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV, q_norm_off, k_norm_off,
                qk_eps, q_out_off, layer, has_qk_norm, step_kv_off, slot, HD: gl.constexpr):
    """`head_epilogue` from the rounding on, for one head's halves lo, hi ([BM, HD / 2] each, bf16 values in fp32):
    the q or k norm, rotary (pos_cos, pos_sin: each row's cos and sin, rounded), the store."""
    HALF: gl.constexpr = HD // 2
    if head < HQ + HKV:
        if has_qk_norm == 1:  # (`head_norm`: over the head's HD columns, its weight per column)
            norm = W + _region(gl.where(head < HQ, q_norm_off, k_norm_off)) + j
            inv = gl.rsqrt((gl.sum(lo * lo, axis=1) + gl.sum(hi * hi, axis=1)) / HD + qk_eps)[:, None]
            lo = _round(_round(lo * inv) * gl.load(norm).to(gl.float32)[None, :])
            hi = _round(_round(hi * inv) * gl.load(norm + HALF).to(gl.float32)[None, :])
        # HF's rotate_half
        lo, hi = (_round(_round(lo * pos_cos) + _round(-hi * pos_sin)),
                  _round(_round(hi * pos_cos) + _round(lo * pos_sin)))
    if head < HQ:
        out = ACT + _region(q_out_off) + (rows.to(gl.int64) * HQ)[:, None] * HD + head * HD + j[None, :]
    else:
        plane = gl.where(head < HQ + HKV, 0, 1)
        out = KV + (layer * 2 + plane) * _region(kv_plane) + (head - HQ - plane * HKV) * HD + \
            (slot.to(gl.int64) * HKV)[:, None] * HD + j[None, :]
    gl.store(out, lo.to(gl.bfloat16), mask=mask)
    gl.store(out + HALF, hi.to(gl.bfloat16), mask=mask)
    if (head >= HQ) & (step_kv_off >= 0):  # ... and to the step's rows (`attention_step_keys`)
        step = ACT + _region(step_kv_off) + (rows.to(gl.int64) * (2 * HKV))[:, None] * HD + (head - HQ) * HD + \
            j[None, :]
        gl.store(step, lo.to(gl.bfloat16), mask=mask)
        gl.store(step + HALF, hi.to(gl.bfloat16), mask=mask)


@gluon.jit
def _consumer(W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n, num_rows, K,
              stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
              has_qk_norm, step_kv_off, positions_at, slots_at, parts_at, tickets_at, HD: gl.constexpr,
              STAGES: gl.constexpr, GROUP: gl.constexpr, NORM_F64: gl.constexpr, STREAM_K: gl.constexpr):
    """Each tile's products, then `_prefill_epilogue` and `head_epilogue` of its heads (BN // HD of the group's q
    heads, then k, then v; `_tile_epilogue`): whole tiles, the rows' sums, positions and slots asked for before the
    products; or (STREAM_K) the fragments of this program's range, a tile's heads by the program that finishes it
    (`tiles.finish_fragment`), the rows' words asked for then."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    i = 0
    if STREAM_K:
        c, c1, KC, total, P = streamk_range(num_m, num_n, K, BK)
        while c < c1:
            finish, acc, m, n, i, c = streamk_step(a_ring, b_ring, ready, empty, i, c, c1, KC, total, P, K, num_m,
                                                   num_n, num_rows, F32, parts_at, tickets_at, STAGES, GROUP)
            if finish:
                sums, rows, pos, slot = _rows_of(m * BM, num_rows, F32, I32, stats_off, positions_at, slots_at,
                                                 acc_layout, half, NORM_F64, BM)
                _tile_epilogue(acc, n, sums, rows, pos, slot, stage, num_rows, K, stats_off, eps, bias_off, HQ, HKV,
                               q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off,
                               W, ACT, F32, KV, kv_plane, HD)
    else:
        consume_tiles(W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n, num_rows, K,
                      stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
                      has_qk_norm, step_kv_off, positions_at, slots_at, i, HD, STAGES, GROUP, NORM_F64)


@gluon.jit
def consume_tiles(W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n, num_rows, K,
                  stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
                  has_qk_norm, step_kv_off, positions_at, slots_at, i, HD: gl.constexpr, STAGES: gl.constexpr,
                  GROUP: gl.constexpr, NORM_F64: gl.constexpr):
    """This program's whole tiles of the group from ring slot i on, the rows' sums, positions and slots asked for
    before each tile's products; returns the slot after them."""
    BM: gl.constexpr = a_ring.type.shape[1]
    BN: gl.constexpr = b_ring.type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, n = tile_at(t, num_m, num_n, GROUP)
        # the rows' words on their way while the products run
        sums, rows, pos, slot = _rows_of(m * BM, num_rows, F32, I32, stats_off, positions_at, slots_at, acc_layout,
                                         half, NORM_F64, BM)
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, STAGES)
        _tile_epilogue(acc, n, sums, rows, pos, slot, stage, num_rows, K, stats_off, eps, bias_off, HQ, HKV,
                       q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off, W, ACT,
                       F32, KV, kv_plane, HD)
    return i


@gluon.jit
def _rows_of(m0, num_rows, F32, I32, stats_off, positions_at, slots_at, acc_layout: gl.constexpr,
             half: gl.constexpr, NORM_F64: gl.constexpr, BM: gl.constexpr):
    """Rows m0 .. m0 + BM's sums of squares (in the products' layout), and their indices, positions and cache slots
    (in the halves' layout)."""
    sums = _row_sums(m0, num_rows, F32, stats_off, acc_layout, NORM_F64, BM)
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, half))
    pos, slot = _row_words(rows, rows < num_rows, I32, positions_at, slots_at)
    return sums, rows, pos, slot


@gluon.jit
def _tile_epilogue(acc, n, sums, rows, pos, slot, stage, num_rows, K, stats_off, eps, bias_off, HQ, HKV, q_norm_off,
                   k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off, W, ACT, F32, KV,
                   kv_plane, HD: gl.constexpr):
    """A tile's heads from its products acc (weight rows n BN ..; the rows' sums, positions and slots asked for
    before them): 1/rms and bias in the products' layout, rounded; the heads' values through `stage` into a layout
    that holds each row's two halves alike; then a head at a time the norm, rotary and stores."""
    BN: gl.constexpr = acc.type.shape[1]
    HEADS: gl.constexpr = BN // HD
    HALF: gl.constexpr = HD // 2
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    num_heads = HQ + 2 * HKV
    j = gl.arange(0, HALF, layout=gl.SliceLayout(0, half))
    mask = (rows < num_rows)[:, None] & (j < HALF)[None, :]
    angles = F32 + _region(rope_off) + pos[:, None] * HD + j[None, :]  # (a table row: HD / 2 cos, HD / 2 sin)
    pos_cos = _round(gl.load(angles, mask=mask, other=0.0))
    pos_sin = _round(gl.load(angles + HALF, mask=mask, other=0.0))
    acc = _scaled(acc, n, sums, K, eps, stats_off, bias_off, W, num_heads, HD)
    stage.store(acc.to(gl.bfloat16))  # (rounded to bf16 as `head_epilogue` rounds it)
    gl.thread_barrier()  # every warp's values in before any reads them in the halves' layout
    for h in gl.static_range(HEADS):
        head = n * HEADS + h
        lo = stage.slice(h * HD, HALF, dim=1).load(half).to(gl.float32)
        hi = stage.slice(h * HD + HALF, HALF, dim=1).load(half).to(gl.float32)
        if head < num_heads:  # (a tile of two heads past the last one has one)
            _store_head(lo, hi, head, rows, j, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV, q_norm_off,
                        k_norm_off, qk_eps, q_out_off, layer, has_qk_norm, step_kv_off, slot, HD)
    gl.thread_barrier()  # every read done before the next tile's values come in


@gluon.jit
def _producer(W, F32, a_ring, b_ring, ready, empty, stages, staged, freed, num_m, num_n, num_rows, K, stats_off, eps,
              bias_off, num_heads, STAGES: gl.constexpr, GROUP: gl.constexpr, NORM_F64: gl.constexpr):
    """With an epilogue partition (`EPILOGUE_WARPS`): each tile's products, 1/rms and bias, rounded to bf16 into
    staging buffer j % 2 (once the epilogue partition has freed it), then on to the next tile's products."""
    BN: gl.constexpr = b_ring.type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    BM: gl.constexpr = a_ring.type.shape[1]
    HD: gl.constexpr = BN
    i = 0
    j = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, n = tile_at(t, num_m, num_n, GROUP)
        sums = _row_sums(m * BM, num_rows, F32, stats_off, acc_layout, NORM_F64, BM)
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, STAGES)
        acc = _scaled(acc, n, sums, K, eps, stats_off, bias_off, W, num_heads, HD)
        b = j % 2
        mbarrier.wait(freed.index(b), ((j // 2) & 1) ^ 1)  # (a barrier starts as if its phase 1 were done)
        stages.index(b).store(acc.to(gl.bfloat16))  # (rounded to bf16 as `head_epilogue` rounds it)
        mbarrier.arrive(staged.index(b))  # (after a barrier of the partition: every warp's values in)
        j += 1


@gluon.jit
def _epilogue(W, ACT, F32, I32, KV, kv_plane, stages, staged, freed, num_m, num_n, num_rows, HQ, HKV, q_norm_off,
              k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off, positions_at, slots_at,
              HD: gl.constexpr, GROUP: gl.constexpr):
    """The epilogue partition: each staged head, CHUNK rows at a time, through `_store_head` (the q or k norm,
    rotary, the stores), while the producers multiply the next tile."""
    BM: gl.constexpr = stages.type.shape[1]
    HALF: gl.constexpr = HD // 2
    CHUNK: gl.constexpr = 32  # rows at a time: a chunk's halves, cos and sin are 16 registers a thread each
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    j_cols = gl.arange(0, HALF, layout=gl.SliceLayout(0, half))
    j = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, head = tile_at(t, num_m, num_n, GROUP)
        b = j % 2
        mbarrier.wait(staged.index(b), (j // 2) & 1)
        for r0 in gl.static_range(0, BM, CHUNK):
            m0 = m * BM + r0
            rows = m0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, half))
            row_ok = rows < num_rows
            pos, slot = _row_words(rows, row_ok, I32, positions_at, slots_at)
            mask = row_ok[:, None] & (j_cols < HALF)[None, :]
            angles = F32 + _region(rope_off) + pos[:, None] * HD + j_cols[None, :]
            pos_cos = _round(gl.load(angles, mask=mask, other=0.0))
            pos_sin = _round(gl.load(angles + HALF, mask=mask, other=0.0))
            rows_of = stages.index(b).slice(r0, CHUNK, dim=0)
            lo = rows_of.slice(0, HALF, dim=1).load(half).to(gl.float32)
            hi = rows_of.slice(HALF, HALF, dim=1).load(half).to(gl.float32)
            _store_head(lo, hi, head, rows, j_cols, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV, q_norm_off,
                        k_norm_off, qk_eps, q_out_off, layer, has_qk_norm, step_kv_off, slot, HD)
        mbarrier.arrive(freed.index(b))  # (after a barrier of the partition: every warp's reads done)
        j += 1


@gluon.jit
def row(desc):
    """The descriptor row's words the consumers read: K, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off,
    qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off."""
    K = gl.load(desc + WORDS[1]).to(gl.int32)
    HQ, HKV = gl.load(desc + WORDS[3]).to(gl.int32), gl.load(desc + WORDS[4]).to(gl.int32)
    eps = gl.load(desc + WORDS[7]).to(gl.float64, bitcast=True).to(gl.float32)
    qk_eps = gl.load(desc + WORDS[11]).to(gl.float64, bitcast=True).to(gl.float32)
    return K, HQ, HKV, gl.load(desc + WORDS[6]), eps, gl.load(desc + WORDS[8]), gl.load(desc + WORDS[9]), \
        gl.load(desc + WORDS[10]), qk_eps, gl.load(desc + WORDS[12]), gl.load(desc + WORDS[13]), \
        gl.load(desc + WORDS[14]), gl.load(desc + WORDS[15]), gl.load(desc + WORDS[16])


@gluon.jit
def inputs(desc, W, ACT, num_rows, HD: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Tensor descriptors of the descriptor row's input rows ([BM, BK] boxes) and weight ([BN, BK]): every head's
    HD rows, q then k then v."""
    K = gl.load(desc + WORDS[1]).to(gl.int32)
    n_cols = (gl.load(desc + WORDS[3]).to(gl.int32) + 2 * gl.load(desc + WORDS[4]).to(gl.int32)) * HD
    return operands(ACT + gl.load(desc + WORDS[0]), K.to(gl.int64), num_rows, W + gl.load(desc + WORDS[2]), n_cols,
                    K, BM, BN, BK)


@gluon.jit
def qkv_prefill(DESCS, W, ACT, F32, I32, KV, kv_plane, desc_index, tokens_at, positions_at, slots_at, parts_at,
                tickets_at, HD: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                GROUP: gl.constexpr, NORM_F64: gl.constexpr, DESC_WORDS: gl.constexpr, LOADER_REGS: gl.constexpr,
                EPILOGUE_WARPS: gl.constexpr, EPILOGUE_REGS: gl.constexpr, STREAM_K: gl.constexpr):
    """Row desc_index of DESCS (a QKV group's descriptor) over the I32[tokens_at] tokens of the step, their positions
    and cache slots at I32[positions_at ..] and I32[slots_at ..]; HD: the heads' dimensions; BN: a tile's columns
    (HD or 2 HD: one head a tile or two), BM its rows. STREAM_K (no epilogue partition): the programs share the
    (tile, K chunk) space (codegen/gluon/tiles.py; a batched decode step: 64 rows make 48 one-head tiles of Llama-3-8B
    for 132 SMs), the cut tiles' partials and tickets at F32[parts_at] and F32[tickets_at] (as
    `linear.linear_prefill`'s)."""
    desc = DESCS + desc_index * DESC_WORDS
    num_rows = gl.load(I32 + tokens_at)
    K, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, \
        step_kv_off = row(desc)
    n_cols = (HQ + 2 * HKV) * HD
    x_desc, w_desc = inputs(desc, W, ACT, num_rows, HD, BM, BN)
    a_ring, b_ring, ready, empty = ring(BM, BN, BK, STAGES)
    # 16-byte units of a row swizzled by the row (its low 3 bits): the products' layout stores 8 rows' 16 bytes at a
    # time and the halves' layout reads 128-byte row pieces, both across every bank
    swizzled: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    num_m = gl.cdiv(num_rows, BM)
    num_n = gl.cdiv(n_cols, BN)
    if EPILOGUE_WARPS > 0:  # one head a tile, its epilogue in a partition of its own, two staging buffers
        stages = gl.allocate_shared_memory(gl.bfloat16, [2, BM, BN], swizzled)
        staged = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        freed = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(staged.index(b), count=1)
            mbarrier.init(freed.index(b), count=1)
        gl.warp_specialize([
            (_producer, (W, F32, a_ring, b_ring, ready, empty, stages, staged, freed, num_m, num_n, num_rows, K,
                         stats_off, eps, bias_off, HQ + 2 * HKV, STAGES, GROUP, NORM_F64)),
            (_epilogue, (W, ACT, F32, I32, KV, kv_plane, stages, staged, freed, num_m, num_n, num_rows, HQ, HKV,
                         q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off,
                         positions_at, slots_at, HD, GROUP)),
            (tile_loader, (x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES, GROUP)),
        ], [EPILOGUE_WARPS, 1], [EPILOGUE_REGS, LOADER_REGS])
    else:
        stage = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], swizzled)
        gl.warp_specialize([
            (_consumer, (W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n,
                         num_rows, K, stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off,
                         layer, rope_off, has_qk_norm, step_kv_off, positions_at, slots_at, parts_at, tickets_at, HD,
                         STAGES, GROUP, NORM_F64, STREAM_K)),
            (streamk_loader if STREAM_K else tile_loader,
             (x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES, GROUP)),
        ], [1], [LOADER_REGS])


# one head a tile: its epilogue in a partition of EPILOGUE_WARPS warps. The program's 16 warps cap every thread at
# 128 registers (Triton hands ptxas `maxnreg`): the [128, 128] products' accumulator is 64 of them, the [128, 256]
# one's 128, so two heads a tile keep their epilogue in the consumers
EPILOGUE_WARPS = 4
SPLIT_LAUNCH = dict(num_warps=LINEAR_WARPS, maxnreg=65536 // ((LINEAR_WARPS + EPILOGUE_WARPS + 4) * 32) // 8 * 8)
# stream-K's (a step of STREAMK_ROWS rows at most): a head a tile, the epilogue in the consumers; 64 rows and 8
# stages, as `linear.STREAMK` (H200, session 63, Llama-3-8B at 64 rows: 957 us over 32 layers against 1,170-1,295 on
# [128, 128] tiles and 5 stages, the Triton group's 942)
STREAMK = Tiles(HEAD_DIM, 8, bm=64)


def split_epilogue(tiles: Tiles, stream_k: bool = False) -> bool:
    """Whether a launch of `tiles` runs its epilogue in a partition of its own (one head a tile, not stream-K)."""
    return tiles.bn == HEAD_DIM and not stream_k


def launch(tiles: Tiles, stream_k: bool = False) -> dict:
    """A launch's options: with the epilogue partition, a program of 16 warps."""
    return SPLIT_LAUNCH if split_epilogue(tiles, stream_k) else tiles.launch()


def constexprs(tiles: Tiles, norm_f64: bool, stream_k: bool = False) -> dict:
    """A launch's constexprs: `tiles` (linear.WIDE: two heads a tile, linear.NARROW: one, its epilogue in a partition
    of its own; with stream_k, STREAMK: one, the epilogue in the consumers) and the sums' type."""
    split = split_epilogue(tiles, stream_k)
    return dict(HD=HEAD_DIM, BM=tiles.bm, BN=tiles.bn, STAGES=tiles.stages, GROUP=8, NORM_F64=norm_f64,
                DESC_WORDS=DESC_WORDS, LOADER_REGS=LOADER_REGS, EPILOGUE_WARPS=EPILOGUE_WARPS if split else 0,
                EPILOGUE_REGS=SPLIT_LAUNCH["maxnreg"] if split else 0, STREAM_K=stream_k)


def unsupported(words: list[int]) -> str | None:
    """Why a QKV descriptor's group cannot run here (None: it can)."""
    f = dict(zip(QKV_FIELDS, words))
    if f["head_dim"] != HEAD_DIM:
        return f"its heads have {f['head_dim']} dimensions, not {HEAD_DIM}"
    if f["rotary_dim"] != f["head_dim"]:
        return f"its rotary covers {f['rotary_dim']} of {f['head_dim']} dimensions"
    for name in ("x_off", "k", "w_off"):
        if f[name] % 8:
            return f"{name} {f[name]} is not a multiple of 8 elements"
    # (the epilogue takes these for regions' offsets, `linear._region`; the cache's planes are multiples of HEAD_DIM)
    regions = ["q_out_off", "rope_off"] + ["q_norm_off", "k_norm_off"] * (f["has_qk_norm"] == 1) + \
        [name for name in ("bias_off", "step_kv_off") if f[name] >= 0]
    for name in regions:
        if f[name] % ALIGN.value:
            return f"{name} {f[name]} is not a multiple of {ALIGN.value} elements"
    return None
