"""The QKV projection's prefill in Gluon: every (row block, head) tile of a QKV group, with its epilogue.

It computes what the group's Triton tasks compute in a step that prefills (codegen/bodies/qkv.py, `qkv_prefill` and
`head_epilogue`), from the same descriptor row (`QKV_FIELDS`): the input rows times the placed weight (the norm's
weight folded in), each row scaled by 1/rms from its producer's sums of squares, the bias, a rounding to bf16; for q
and k heads the per-head RMSNorm (Qwen3's q_norm and k_norm) and the rotary embedding at each token's position, every
step rounded as the Triton body rounds it; then q heads to the activation rows attention reads, k and v heads to the
paged cache at each token's slot (and to the step's rows with `attention_step_keys`).

The tiles are [128, head_dim] (a head a column block), multiplied as the projections' (codegen/gluon/tiles.py). The
epilogue takes the head's values through shared memory so that each row's two halves (rotary pairs column j with
j + head_dim / 2) come back in one layout, and stores by pointers: a q row and a cache row are each one contiguous
head. Heads of 128 dimensions with rotary over all of them (Llama-3, Qwen3, Phi-4); others stay with the Triton body.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from codegen.bodies.qkv import QKV_FIELDS
from codegen.gluon.linear import LAUNCH, LOADER_REGS, _norm_sums, _round
from codegen.gluon.tiles import operands, ring, tile_at, tile_loader, tile_product
from codegen.tasks import DESC_WORDS

USED = ("x_off", "k", "w_off", "num_q_heads", "num_kv_heads", "head_dim", "stats_off", "eps", "bias_off",
        "q_norm_off", "k_norm_off", "qk_eps", "q_out_off", "layer", "rope_off", "has_qk_norm", "step_kv_off")
WORDS = gl.constexpr(tuple(QKV_FIELDS.index(f) for f in USED))
BM, BK = gl.constexpr(128), gl.constexpr(64)
HEAD_DIM = 128
STAGES = 4

SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "KV": "*bf16",
             "kv_plane": "i64", "desc_index": "i32", "tokens_at": "i32", "positions_at": "i32", "slots_at": "i32"}


@gluon.jit
def _head_norm(y, W, norm_off, eps, HD: gl.constexpr):
    """`head_norm`: each row of one head (y [R, HD], bf16 values in fp32) scaled to unit rms and by the weight."""
    w = gl.load(W + norm_off + gl.arange(0, HD, layout=gl.SliceLayout(0, y.type.layout))).to(gl.float32)
    inv = gl.rsqrt(gl.sum(y * y, axis=1) / HD + eps)
    return _round(_round(y * inv[:, None]) * w[None, :])


@gluon.jit
def _epilogue(acc, head, m0, num_rows, K, W, ACT, F32, I32, KV, kv_plane, stage, stats_off, eps, bias_off, HQ, HKV,
              q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off, positions_at,
              slots_at, NORM_F64: gl.constexpr):
    """`_prefill_epilogue` and `head_epilogue` of one tile: the fp32 products acc [BM, HD] of rows m0 .. and head
    `head` of the group's (q heads, then k, then v); `stage` a [BM, HD] buffer in shared memory."""
    HD: gl.constexpr = acc.type.shape[1]
    HALF: gl.constexpr = HD // 2
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, acc.type.layout))
    cols = gl.arange(0, HD, layout=gl.SliceLayout(0, acc.type.layout))
    if stats_off >= 0:
        sums = gl.load(_norm_sums(F32, stats_off, NORM_F64) + rows, mask=rows < num_rows, other=1.0).to(gl.float32)
        acc = acc * gl.rsqrt(sums / K.to(gl.float32) + eps)[:, None]
    if bias_off >= 0:
        acc = acc + gl.load(W + bias_off + head * HD + cols).to(gl.float32)[None, :]
    y = _round(acc)
    rotated = head < HQ + HKV
    if rotated & (has_qk_norm == 1):
        y = _head_norm(y, W, gl.where(head < HQ, q_norm_off, k_norm_off), qk_eps, HD)
    stage.store(y.to(gl.bfloat16))
    gl.thread_barrier()  # every warp's values in before any reads them in the halves' layout
    half: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    lo = stage.slice(0, HALF, dim=1).load(half).to(gl.float32)
    hi = stage.slice(HALF, HALF, dim=1).load(half).to(gl.float32)
    gl.thread_barrier()  # every read done before the next tile's values come in
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, half))
    j = gl.arange(0, HALF, layout=gl.SliceLayout(0, half))
    row_ok = rows < num_rows
    mask = row_ok[:, None] & (j < HALF)[None, :]
    if rotated:  # HF's rotate_half, cos and sin of each position from the table (a row: HD / 2 cos, HD / 2 sin)
        pos = gl.load(I32 + positions_at + rows, mask=row_ok, other=0)
        angles = F32 + rope_off + pos[:, None] * HD + j[None, :]
        cos, sin = _round(gl.load(angles, mask=mask, other=0.0)), _round(gl.load(angles + HALF, mask=mask, other=0.0))
        lo, hi = _round(_round(lo * cos) + _round(-hi * sin)), _round(_round(hi * cos) + _round(lo * sin))
    if head < HQ:
        out = ACT + q_out_off + rows[:, None].to(gl.int64) * (HQ * HD) + head * HD + j[None, :]
        gl.store(out, lo.to(gl.bfloat16), mask=mask)
        gl.store(out + HALF, hi.to(gl.bfloat16), mask=mask)
    else:
        slot = gl.load(I32 + slots_at + rows, mask=row_ok, other=0).to(gl.int64)
        plane = gl.where(head < HQ + HKV, 0, 1)
        kv_head = head - HQ - plane * HKV
        out = KV + (layer * 2 + plane) * kv_plane + kv_head * HD + slot[:, None] * (HKV * HD) + j[None, :]
        gl.store(out, lo.to(gl.bfloat16), mask=mask)
        gl.store(out + HALF, hi.to(gl.bfloat16), mask=mask)
        if step_kv_off >= 0:  # ... and to the step's rows (`attention_step_keys`)
            step = ACT + step_kv_off + rows[:, None].to(gl.int64) * (2 * HKV * HD) + (head - HQ) * HD + j[None, :]
            gl.store(step, lo.to(gl.bfloat16), mask=mask)
            gl.store(step + HALF, hi.to(gl.bfloat16), mask=mask)


@gluon.jit
def _consumer(W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_n, num_rows, K,
              stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
              has_qk_norm, step_kv_off, positions_at, slots_at, STAGES_: gl.constexpr, GROUP: gl.constexpr,
              NORM_F64: gl.constexpr):
    i = 0
    for t in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        m, head = tile_at(t, num_m, num_n, GROUP)
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, STAGES_)
        _epilogue(acc, head, m * BM, num_rows, K, W, ACT, F32, I32, KV, kv_plane, stage, stats_off, eps, bias_off,
                  HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off,
                  positions_at, slots_at, NORM_F64)


@gluon.jit
def qkv_prefill(DESCS, W, ACT, F32, I32, KV, kv_plane, desc_index, tokens_at, positions_at, slots_at,
                HD: gl.constexpr, STAGES_: gl.constexpr, GROUP: gl.constexpr, NORM_F64: gl.constexpr,
                DESC_WORDS: gl.constexpr, LOADER_REGS: gl.constexpr):
    """Row desc_index of DESCS (a QKV group's descriptor) over the I32[tokens_at] tokens of the step, their positions
    and cache slots at I32[positions_at ..] and I32[slots_at ..]; HD: the heads' dimensions."""
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
    num_heads = HQ + 2 * HKV
    x_desc, w_desc = operands(ACT + x_off, K.to(gl.int64), num_rows, W + w_off, num_heads * HD, K, BM, HD, BK)
    a_ring, b_ring, ready, empty = ring(BM, HD, BK, STAGES_)
    stage = gl.allocate_shared_memory(gl.bfloat16, [BM, HD], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    num_m = gl.cdiv(num_rows, BM)
    gl.warp_specialize([
        (_consumer, (W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, stage, num_m, num_heads, num_rows,
                     K, stats_off, eps, bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
                     has_qk_norm, step_kv_off, positions_at, slots_at, STAGES_, GROUP, NORM_F64)),
        (tile_loader, (x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_heads, K, STAGES_, GROUP)),
    ], [1], [LOADER_REGS])


def constexprs(norm_f64: bool) -> dict:
    return dict(HD=HEAD_DIM, STAGES_=STAGES, GROUP=8, NORM_F64=norm_f64, DESC_WORDS=DESC_WORDS, LOADER_REGS=LOADER_REGS)


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
