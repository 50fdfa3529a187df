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
conflicts) 6,189 against 5,915, at 512 tokens 2,171 against 2,154. The epilogue is still ~40% of the consumers'
stall samples, with no products under it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from codegen.bodies.qkv import QKV_FIELDS
from codegen.gluon.linear import LAUNCH, LOADER_REGS, Tiles, _norm_sums, _round
from codegen.gluon.tiles import operands, ring, tile_at, tile_loader, tile_product
from codegen.tasks import DESC_WORDS

USED = ("x_off", "k", "w_off", "num_q_heads", "num_kv_heads", "head_dim", "stats_off", "eps", "bias_off",
        "q_norm_off", "k_norm_off", "qk_eps", "q_out_off", "layer", "rope_off", "has_qk_norm", "step_kv_off")
WORDS = gl.constexpr(tuple(QKV_FIELDS.index(f) for f in USED))
BM, BK = gl.constexpr(128), gl.constexpr(64)
HEAD_DIM = 128

SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "KV": "*bf16",
             "kv_plane": "i64", "desc_index": "i32", "tokens_at": "i32", "positions_at": "i32", "slots_at": "i32"}


@gluon.jit
def _row_loads(m0, num_rows, F32, I32, stats_off, positions_at, slots_at, layout: gl.constexpr,
               NORM_F64: gl.constexpr):
    """What a tile's epilogue reads a row, asked for before its products (they do not depend on them): the rows'
    sums of squares (1 where no norm applies), positions and cache slots, in `layout`'s rows."""
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    row_ok = rows < num_rows
    sums = gl.load(_norm_sums(F32, gl.maximum(stats_off, 0), NORM_F64) + rows, mask=row_ok & (stats_off >= 0),
                   other=1.0).to(gl.float32)
    pos = gl.load(I32 + positions_at + rows, mask=row_ok, other=0)
    slot = gl.load(I32 + slots_at + rows, mask=row_ok, other=0)
    return sums, pos, slot


@gluon.jit
def _store_head(lo, hi, head, rows, j, mask, pos_cos, pos_sin, W, ACT, KV, kv_plane, HQ, HKV, q_norm_off, k_norm_off,
                qk_eps, q_out_off, layer, has_qk_norm, step_kv_off, slot, HD: gl.constexpr):
    """`head_epilogue` from the rounding on, for one head's halves lo, hi ([BM, HD / 2] each, bf16 values in fp32):
    the q or k norm, rotary (pos_cos, pos_sin: each row's cos and sin, rounded), the store."""
    HALF: gl.constexpr = HD // 2
    if head < HQ + HKV:
        if has_qk_norm == 1:  # (`head_norm`: over the head's HD columns, its weight per column)
            norm = W + gl.where(head < HQ, q_norm_off, k_norm_off) + j
            inv = gl.rsqrt((gl.sum(lo * lo, axis=1) + gl.sum(hi * hi, axis=1)) / HD + qk_eps)[:, None]
            lo = _round(_round(lo * inv) * gl.load(norm).to(gl.float32)[None, :])
            hi = _round(_round(hi * inv) * gl.load(norm + HALF).to(gl.float32)[None, :])
        # HF's rotate_half
        lo, hi = (_round(_round(lo * pos_cos) + _round(-hi * pos_sin)),
                  _round(_round(hi * pos_cos) + _round(lo * pos_sin)))
    if head < HQ:
        out = ACT + q_out_off + rows[:, None].to(gl.int64) * (HQ * HD) + head * HD + j[None, :]
    else:
        plane = gl.where(head < HQ + HKV, 0, 1)
        out = KV + (layer * 2 + plane) * kv_plane + (head - HQ - plane * HKV) * HD + \
            slot.to(gl.int64)[:, None] * (HKV * HD) + j[None, :]
    gl.store(out, lo.to(gl.bfloat16), mask=mask)
    gl.store(out + HALF, hi.to(gl.bfloat16), mask=mask)
    if (head >= HQ) & (step_kv_off >= 0):  # ... and to the step's rows (`attention_step_keys`)
        step = ACT + step_kv_off + rows[:, None].to(gl.int64) * (2 * HKV * HD) + (head - HQ) * HD + j[None, :]
        gl.store(step, lo.to(gl.bfloat16), mask=mask)
        gl.store(step + HALF, hi.to(gl.bfloat16), mask=mask)


@gluon.jit
def _consumer(W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n, num_rows, K,
              stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
              has_qk_norm, step_kv_off, positions_at, slots_at, HD: gl.constexpr, STAGES: gl.constexpr,
              GROUP: gl.constexpr, NORM_F64: gl.constexpr):
    """Each tile's products, then `_prefill_epilogue` and `head_epilogue` of its heads (BN // HD of the group's q
    heads, then k, then v): 1/rms and bias in the products' layout, rounded; the heads' values through `stage` into
    a layout that holds each row's two halves alike; then a head at a time the norm, rotary and stores."""
    BN: gl.constexpr = b_ring.type.shape[1]
    HEADS: gl.constexpr = BN // HD
    HALF: gl.constexpr = HD // 2
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    num_heads = HQ + 2 * HKV
    j = gl.arange(0, HALF, layout=gl.SliceLayout(0, half))
    i = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, n = tile_at(t, num_m, num_n, GROUP)
        m0 = m * BM
        # the rows' words on their way while the products run
        sums, _, _ = _row_loads(m0, num_rows, F32, I32, stats_off, positions_at, slots_at, acc_layout, NORM_F64)
        _, pos, slot = _row_loads(m0, num_rows, F32, I32, -1, positions_at, slots_at, half, NORM_F64)
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, STAGES)
        rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, half))
        mask = (rows < num_rows)[:, None] & (j < HALF)[None, :]
        angles = F32 + rope_off + pos[:, None] * HD + j[None, :]  # (a row of the table: HD / 2 cos, HD / 2 sin)
        pos_cos = _round(gl.load(angles, mask=mask, other=0.0))
        pos_sin = _round(gl.load(angles + HALF, mask=mask, other=0.0))
        if stats_off >= 0:
            acc = acc * gl.rsqrt(sums / K.to(gl.float32) + eps)[:, None]
        if bias_off >= 0:
            cols = n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
            acc = acc + gl.load(W + bias_off + cols, mask=cols < num_heads * HD, other=0.0).to(gl.float32)[None, :]
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
def qkv_prefill(DESCS, W, ACT, F32, I32, KV, kv_plane, desc_index, tokens_at, positions_at, slots_at,
                HD: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
                NORM_F64: gl.constexpr, DESC_WORDS: gl.constexpr, LOADER_REGS: gl.constexpr):
    """Row desc_index of DESCS (a QKV group's descriptor) over the I32[tokens_at] tokens of the step, their positions
    and cache slots at I32[positions_at ..] and I32[slots_at ..]; HD: the heads' dimensions; BN: a tile's columns
    (HD or 2 HD: one head a tile or two)."""
    desc = DESCS + desc_index * DESC_WORDS
    num_rows = gl.load(I32 + tokens_at)
    x_off, K, w_off = gl.load(desc + WORDS[0]), gl.load(desc + WORDS[1]).to(gl.int32), gl.load(desc + WORDS[2])
    HQ, HKV = gl.load(desc + WORDS[3]).to(gl.int32), gl.load(desc + WORDS[4]).to(gl.int32)
    stats_off = gl.load(desc + WORDS[6])
    eps = gl.load(desc + WORDS[7]).to(gl.float64, bitcast=True).to(gl.float32)
    bias_off, q_norm_off, k_norm_off = gl.load(desc + WORDS[8]), gl.load(desc + WORDS[9]), gl.load(desc + WORDS[10])
    qk_eps = gl.load(desc + WORDS[11]).to(gl.float64, bitcast=True).to(gl.float32)
    q_out_off, layer, rope_off = gl.load(desc + WORDS[12]), gl.load(desc + WORDS[13]), gl.load(desc + WORDS[14])
    has_qk_norm, step_kv_off = gl.load(desc + WORDS[15]), gl.load(desc + WORDS[16])
    n_cols = (HQ + 2 * HKV) * HD
    x_desc, w_desc = operands(ACT + x_off, K.to(gl.int64), num_rows, W + w_off, n_cols, K, BM, BN, BK)
    a_ring, b_ring, ready, empty = ring(BM, BN, BK, STAGES)
    # 16-byte units of a row swizzled by the row (its low 3 bits): the products' layout stores 8 rows' 16 bytes at a
    # time and the halves' layout reads 128-byte row pieces, both across every bank
    stage = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    num_m = gl.cdiv(num_rows, BM)
    num_n = gl.cdiv(n_cols, BN)
    gl.warp_specialize([
        (_consumer, (W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n, num_rows,
                     K, stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
                     has_qk_norm, step_kv_off, positions_at, slots_at, HD, STAGES, GROUP, NORM_F64)),
        (tile_loader, (x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, STAGES, GROUP)),
    ], [1], [LOADER_REGS])


def constexprs(tiles: Tiles, norm_f64: bool) -> dict:
    """A launch's constexprs: `tiles` (linear.WIDE: two heads a tile, linear.NARROW: one) and the sums' type."""
    return dict(HD=HEAD_DIM, BN=tiles.bn, STAGES=tiles.stages, GROUP=8, NORM_F64=norm_f64, DESC_WORDS=DESC_WORDS,
                LOADER_REGS=LOADER_REGS)


def unsupported(words: list[int]) -> str | None:
    """Why a QKV descriptor's group cannot run here (None: it can)."""
    f = dict(zip(QKV_FIELDS, words))
    if f["head_dim"] != HEAD_DIM:
        return f"its heads have {f['head_dim']} dimensions, not {HEAD_DIM}"
    if f["rotary_dim"] != f["head_dim"]:
        return f"its rotary covers {f['rotary_dim']} of {f['head_dim']} dimensions"
    for name in ("x_off", "k", "w_off", "q_out_off"):
        if f[name] % 8:
            return f"{name} {f[name]} is not a multiple of 8 elements"
    return None
