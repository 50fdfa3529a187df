"""One row's projections in Gluon: a LINEAR or QKV group's output in a step of one row (batch-1 decode), a GEMV.

It computes what the group's Triton tasks compute in a one-row step (codegen/bodies/linear.py, `gemv_stream` and
`gemv_row` with `kept_epilogue`), from the same descriptor row (`LINEAR_FIELDS`) and arenas: the row times the placed
weight (an RMSNorm's weight folded into it), scaled by 1/rms from its producer's sum of squares, the bias, a rounding
to bf16, gate/up's silu(gate) * up (the placed weight's rows alternate gate, up), the residual added and rounded
again, the store (bf16 activations, or the LM head's fp32 logits), and the stored row's sum of squares added into F32
for the norm that reads it. QKV (`qkv_gemv`, as `split_head` and `head_epilogue`): each head's row whole in
scratch, then the prefill body's epilogue (bias, q/k norm, rotary, q or the paged cache) by the unit that completes
the head.

The weight's rows come in units of GR (a unit: GR outputs over all of K). Program p of G takes units p U / G .. (p +
1) U / G, contiguous, so every program streams its share without a seam to settle with another. Two programs an SM
(two independent streams: session 59 measured a one-row chain at 84-87% of the bandwidth on one program an SM and 92%
on two), each a loader warp that copies [GR, 256] weight boxes and the row's matching [1, 256] box by TMA into a ring
of SLOTS slots of BOXES boxes (16 KB of weights a slot, whatever GR), and a consumer warp group that multiplies each
box on the CUDA cores into an fp32 [GR, 256] accumulator, reduced once a unit and handed to the epilogue while the
loader streams on. `rows_for` picks GR so that the units fill two programs an SM evenly.

H200, Llama-3-8B's batch-1 decode step at context 512 in the host-driven executor (`benchmarks/gluon_groups.py
--decode 1x512`, session 61, 32 layers, each group a launch): gate/up 1,900-1,930 us against the Triton stream's
1,939-1,975 (3.9 TB/s of weights), down 1,102-1,127 against 1,079-1,087, o_proj 538-555 against 491-502, the LM head
236-237 against 241-242; the unit height (8, 16 or 32 rows) moved none of them more than 3%. A group this short
is mostly a launch's fixed costs (o_proj: 32 MB in ~17 us, 8 at the bandwidth); in the persistent kernel, whose
loaders stream on across groups, they are not paid a group.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from codegen.bodies.linear import LINEAR_FIELDS, OUT_ALIGNED, OUT_F32
from codegen.bodies.qkv import QKV_FIELDS
from codegen.gluon import qkv
from codegen.gluon.events import wait
from codegen.gluon.linear import _norm_sums, _region, _round
from codegen.gluon.qkv import HEAD_DIM, _store_head
from codegen.tasks import DESC_WORDS

USED = ("x_off", "k", "w_off", "n", "out_off", "out_kind", "stats_off", "eps", "res_off", "bias_off", "out_stats_off")
WORDS = gl.constexpr(tuple(LINEAR_FIELDS.index(f) for f in USED))
GK = gl.constexpr(256)  # a box's columns of K: the widest TMA box (unswizzled: the consumers read it by rows)
SLOT_ROWS = gl.constexpr(32)  # GR x BOXES: a slot's weight rows of GK, 16 KB
SLOTS = 6
PER_SM = 2  # programs an SM
CONSUMER_WARPS, LOADER_REGS = 4, 40
# two programs an SM: each program's warps (the consumers' warp group and the loader's, allocated as a warp group)
# hold half the register file
LAUNCH = dict(num_warps=CONSUMER_WARPS, maxnreg=65536 // PER_SM // ((CONSUMER_WARPS + 4) * 32) // 8 * 8)

SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "desc_index": "i32", "units": "i32"}


@gluon.jit
def _units(units):
    """This program's units: u0 .. u1 of `units`, contiguous."""
    p, G = gl.program_id(0), gl.num_programs(0)
    return p * units // G, (p + 1) * units // G


@gluon.jit
def _loader(w_desc, x_desc, w_ring, x_ring, ready, empty, units, K, SLOTS_: gl.constexpr):
    """Every box of this program's units into the ring: a slot's BOXES weight boxes and the row's boxes beside them."""
    GK_: gl.constexpr = w_ring.type.shape[2]
    BOXES: gl.constexpr = w_ring.type.shape[0] // SLOTS_
    u0, u1 = _units(units)
    i = 0
    for u in range(u0, u1):
        for k0 in range(0, K, BOXES * GK_):
            i = fill_slot(w_desc, x_desc, w_ring, x_ring, ready, empty, i, u, k0, SLOTS_, True)


@gluon.jit
def fill_slot(w_desc, x_desc, w_ring, x_ring, ready, empty, i, u, k0, SLOTS_: gl.constexpr, ROW: gl.constexpr):
    """Ring slot use i: unit u's BOXES weight boxes from column k0, and (ROW) the row's boxes beside them, once the
    consumers have released the slot's use before; returns i + 1. Without ROW the slot still expects the row's bytes
    (`copy_row` sends them later)."""
    GR: gl.constexpr = w_ring.type.shape[1]
    GK_: gl.constexpr = w_ring.type.shape[2]
    BOXES: gl.constexpr = w_ring.type.shape[0] // SLOTS_
    s = i % SLOTS_
    mbarrier.wait(empty.index(s), ((i // SLOTS_) & 1) ^ 1)  # (a barrier starts as if its phase 1 were done)
    # every box of the slot (a constant byte count): past K, TMA's zeros
    mbarrier.expect(ready.index(s), BOXES * (GR + 1) * GK_ * 2)
    for b in gl.static_range(BOXES):
        tma.async_copy_global_to_shared(w_desc, [u * GR, k0 + b * GK_], ready.index(s), w_ring.index(s * BOXES + b))
        if ROW:
            tma.async_copy_global_to_shared(x_desc, [0, k0 + b * GK_], ready.index(s), x_ring.index(s * BOXES + b))
    return i + 1


@gluon.jit
def copy_row(x_desc, x_ring, ready, i, k0, SLOTS_: gl.constexpr):
    """The row's boxes from column k0 into ring slot use i, which `fill_slot` filled without them."""
    GK_: gl.constexpr = x_ring.type.shape[2]
    BOXES: gl.constexpr = x_ring.type.shape[0] // SLOTS_
    s = i % SLOTS_
    for b in gl.static_range(BOXES):
        tma.async_copy_global_to_shared(x_desc, [0, k0 + b * GK_], ready.index(s), x_ring.index(s * BOXES + b))


@gluon.jit
def _inv_rms(F32, stats_off, K, eps, NORM_F64: gl.constexpr):
    """1/rms of the step's row from its producer's sum of squares (1 where no norm applies: `row_inv_rms`)."""
    sums = gl.load(_norm_sums(F32, gl.maximum(stats_off, 0), NORM_F64), mask=stats_off >= 0, other=1.0)
    return gl.where(stats_off >= 0, gl.rsqrt(sums.to(gl.float32) / K.to(gl.float32) + eps), 1.0)


@gluon.jit
def _unit(w_ring, x_ring, ready, empty, i, K, SLOTS_: gl.constexpr, vec: gl.constexpr):
    """A unit's GR products over all of K from ring slot i on, in `vec`; returns them and the next unit's slot.
    (The row comes through the ring beside the weights: read by the consumers from L2 instead, even a box ahead, a
    chain of projections ran at half the rate; `benchmarks/explore/ws_decode_chain.py`, session 62.)"""
    GR: gl.constexpr = w_ring.type.shape[1]
    GK_: gl.constexpr = w_ring.type.shape[2]
    BOXES: gl.constexpr = w_ring.type.shape[0] // SLOTS_
    box: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    acc = gl.zeros([GR, GK_], gl.float32, box)
    for k0 in range(0, K, BOXES * GK_):
        s = i % SLOTS_
        mbarrier.wait(ready.index(s), (i // SLOTS_) & 1)
        for b in gl.static_range(BOXES):
            w = w_ring.index(s * BOXES + b).load(box).to(gl.float32)
            acc += w * x_ring.index(s * BOXES + b).load(box).to(gl.float32)  # ([1, GK]: every row's the same)
        fence_async_shared()  # the slot's reads before the loader's next copies into it
        mbarrier.arrive(empty.index(s))  # (after a barrier of the warp group: every warp's reads)
        i += 1
    return gl.convert_layout(gl.sum(acc, axis=1), vec), i


@gluon.jit
def _epilogue(y, u, inv, W, ACT, F32, N, out_off, res_off, bias_off, GATED: gl.constexpr, OUT_KIND: gl.constexpr):
    """`kept_epilogue` of unit u's GR products y (in a 1-D layout): 1/rms, bias, gating, residual, the store; returns
    the stored values' sum of squares."""
    GR: gl.constexpr = y.type.shape[0]
    cols = u * GR + gl.arange(0, GR, layout=y.type.layout)
    bias = gl.load(W + gl.maximum(bias_off, 0) + cols, mask=(cols < N) & (bias_off >= 0), other=0.0)
    y = _round(y * inv + bias.to(gl.float32))
    n_out = N
    if GATED:  # columns alternate gate, up: output column j is silu(y[2j]) * y[2j + 1]
        gate, up = gl.split(gl.reshape(y, [GR // 2, 2]))
        y = _round(_round(gate / (1.0 + gl.exp(-gate))) * up)
        cols = u * (GR // 2) + gl.arange(0, GR // 2, layout=y.type.layout)
        n_out = N // 2
    ok = cols < n_out
    if res_off >= 0:
        y = _round(gl.load(ACT + res_off + cols, mask=ok, other=0.0).to(gl.float32) + y)
    if OUT_KIND == 1:  # OUT_F32: the logits
        gl.store(F32 + out_off + cols, y, mask=ok)
    else:
        gl.store(ACT + out_off + cols, y.to(gl.bfloat16), mask=ok)
    return gl.sum(gl.where(ok, y * y, 0.0), axis=0)


@gluon.jit
def _consumer(W, ACT, F32, w_ring, x_ring, ready, empty, units, K, N, out_off, stats_off, eps, res_off, bias_off,
              out_stats_off, SLOTS_: gl.constexpr, GATED: gl.constexpr, OUT_KIND: gl.constexpr,
              NORM_F64: gl.constexpr):
    u0, u1 = _units(units)
    i = 0
    linear_units(W, ACT, F32, w_ring, x_ring, ready, empty, u0, u1, i, K, N, out_off, stats_off, eps, res_off, bias_off,
                 out_stats_off, SLOTS_, GATED, OUT_KIND, NORM_F64)


@gluon.jit
def linear_units(W, ACT, F32, w_ring, x_ring, ready, empty, u0, u1, i, K, N, out_off, stats_off, eps, res_off,
                 bias_off, out_stats_off, SLOTS_: gl.constexpr, GATED: gl.constexpr, OUT_KIND: gl.constexpr,
                 NORM_F64: gl.constexpr, EVENTS=None, event=0):
    """Units u0 .. u1 of a projection from ring slot i on: their products, epilogues and the stored row's sum of
    squares added into the norm's; returns the slot after them. EVENTS: the 1/rms and the epilogues wait for
    EVENTS[event - 1] to reach the programs' count first, after the first unit's products (a persistent kernel's
    group, whose loader may have copied weights before the group before was done: `codegen/gluon/chain.py`)."""
    vec: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])
    sq = gl.to_tensor(0.0)  # the stored row's sum of squares, this program's share
    inv = gl.to_tensor(1.0)
    for u in range(u0, u1):
        y, i = _unit(w_ring, x_ring, ready, empty, i, K, SLOTS_, vec)
        if u == u0:
            if EVENTS is not None:
                wait(EVENTS, event - 1, gl.num_programs(0))
            inv = _inv_rms(F32, stats_off, K, eps, NORM_F64)
        sq += _epilogue(y, u, inv, W, ACT, F32, N, out_off, res_off, bias_off, GATED, OUT_KIND)
    if (out_stats_off >= 0) & (u1 > u0):
        out_sums = _norm_sums(F32, out_stats_off, NORM_F64)
        gl.atomic_add(out_sums, sq.to(out_sums.dtype.element_ty), sem="relaxed")  # (published by the signal)
    return i


@gluon.jit
def _stream(Wt, N, X, K, GR: gl.constexpr, SLOTS_: gl.constexpr):
    """The weight [N, K] at Wt and the row [K] at X as tensor descriptors of [GR, GK] and [1, GK] boxes, the ring
    (SLOTS_ slots of SLOT_ROWS // GR boxes of each) and its barriers."""
    BOXES: gl.constexpr = SLOT_ROWS // GR
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_desc = tma.make_tensor_descriptor(Wt, [N, K], [K.to(gl.int64), 1], [GR, GK], plain)
    x_desc = tma.make_tensor_descriptor(X, [1, K], [K.to(gl.int64), 1], [1, GK], plain)
    w_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS_ * BOXES, GR, GK], plain)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS_ * BOXES, 1, GK], plain)
    ready = gl.allocate_shared_memory(gl.int64, [SLOTS_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS_, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS_):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return w_desc, x_desc, w_ring, x_ring, ready, empty


@gluon.jit
def linear_row(desc):
    """A LINEAR descriptor row's words: x_off, K, w_off, N, out_off, stats_off, eps, res_off, bias_off,
    out_stats_off."""
    K, N = gl.load(desc + WORDS[1]).to(gl.int32), gl.load(desc + WORDS[3]).to(gl.int32)
    eps = gl.load(desc + WORDS[7]).to(gl.float64, bitcast=True).to(gl.float32)
    return gl.load(desc + WORDS[0]), K, gl.load(desc + WORDS[2]), N, gl.load(desc + WORDS[4]), \
        gl.load(desc + WORDS[6]), eps, gl.load(desc + WORDS[8]), gl.load(desc + WORDS[9]), gl.load(desc + WORDS[10])


@gluon.jit
def linear_gemv(DESCS, W, ACT, F32, desc_index, units, GR: gl.constexpr, SLOTS_: gl.constexpr, GATED: gl.constexpr,
                OUT_KIND: gl.constexpr, NORM_F64: gl.constexpr, DESC_WORDS: gl.constexpr, LOADER_REGS: gl.constexpr):
    """Row desc_index of DESCS (a LINEAR group's descriptor) over a step's one row, in `units` units of GR weight
    rows. GATED, OUT_KIND: the descriptor's `gated` and `out_kind` words; NORM_F64: the norms' sums are fp64."""
    x_off, K, w_off, N, out_off, stats_off, eps, res_off, bias_off, out_stats_off = \
        linear_row(DESCS + desc_index * DESC_WORDS)
    w_desc, x_desc, w_ring, x_ring, ready, empty = _stream(W + w_off, N, ACT + x_off, K, GR, SLOTS_)
    gl.warp_specialize([
        (_consumer, (W, ACT, F32, w_ring, x_ring, ready, empty, units, K, N, out_off, stats_off, eps, res_off,
                     bias_off, out_stats_off, SLOTS_, GATED, OUT_KIND, NORM_F64)),
        (_loader, (w_desc, x_desc, w_ring, x_ring, ready, empty, units, K, SLOTS_)),
    ], [1], [LOADER_REGS])


QKV_USED = ("x_off", "k", "w_off", "num_q_heads", "num_kv_heads", "stats_off", "eps", "bias_off", "q_norm_off",
            "k_norm_off", "qk_eps", "q_out_off", "layer", "rope_off", "has_qk_norm", "step_kv_off", "part_off",
            "ticket_off")
QKV_WORDS = gl.constexpr(tuple(QKV_FIELDS.index(f) for f in QKV_USED))
QKV_SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "KV": "*bf16",
                 "kv_plane": "i64", "desc_index": "i32", "units": "i32", "positions_at": "i32", "slots_at": "i32"}


@gluon.jit
def _qkv_consumer(W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, units, K, stats_off, eps, bias_off,
                  HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off,
                  part_off, ticket_off, positions_at, slots_at, SLOTS_: gl.constexpr, HD: gl.constexpr,
                  NORM_F64: gl.constexpr):
    """Each unit's GR products times 1/rms into the head's fp32 row at `part_off`, then the head's ticket; the unit
    that completes a head (the last of its HD / GR to arrive) runs `head_epilogue` for it: the bias, a rounding, then
    `qkv._store_head` (q/k norm, rotary at the row's position, the store to q or the cache), as the prefill body."""
    u0, u1 = _units(units)
    i = 0
    qkv_units(W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, u0, u1, i, K, stats_off, eps, bias_off, HQ,
              HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off, part_off,
              ticket_off, positions_at, slots_at, SLOTS_, HD, NORM_F64)


@gluon.jit
def qkv_units(W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, u0, u1, i, K, stats_off, eps, bias_off, HQ,
              HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, step_kv_off, part_off,
              ticket_off, positions_at, slots_at, SLOTS_: gl.constexpr, HD: gl.constexpr, NORM_F64: gl.constexpr,
              EVENTS=None, event=0):
    """`_qkv_consumer`'s units u0 .. u1 from ring slot i on; returns the slot after them. EVENTS: as `linear_units`."""
    GR: gl.constexpr = w_ring.type.shape[1]
    PER_HEAD: gl.constexpr = HD // GR
    HALF: gl.constexpr = HD // 2
    vec: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])
    row: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [1, gl.num_warps()], [1, 0])  # a [1, HALF] half of a head
    parts = F32 + _region(part_off)
    inv = gl.to_tensor(1.0)
    for u in range(u0, u1):
        y, i = _unit(w_ring, x_ring, ready, empty, i, K, SLOTS_, vec)
        if u == u0:
            if EVENTS is not None:
                wait(EVENTS, event - 1, gl.num_programs(0))
            inv = _inv_rms(F32, stats_off, K, eps, NORM_F64)
        gl.store(parts + u * GR + gl.arange(0, GR, layout=vec), y * inv)
        head = u // PER_HEAD
        gl.thread_barrier()  # every thread's values stored before the ticket publishes them (`arrives_last`)
        arrived = gl.atomic_add(F32 + ticket_off + head, 1.0, sem="acq_rel")
        gl.thread_barrier()
        if arrived == PER_HEAD - 1:  # the head's every unit is in: its epilogue
            gl.store(F32 + ticket_off + head, 0.0)  # (for the next layer's step)
            rows = gl.arange(0, 1, layout=gl.SliceLayout(1, row))
            j = gl.arange(0, HALF, layout=gl.SliceLayout(0, row))
            values = parts + head * HD + j[None, :] + rows[:, None]
            lo = gl.load(values, cache_modifier=".cg")  # (other programs' units: from L2, past this SM's L1)
            hi = gl.load(values + HALF, cache_modifier=".cg")
            if bias_off >= 0:
                bias = W + _region(bias_off) + head * HD + j[None, :]
                lo += gl.load(bias).to(gl.float32)
                hi += gl.load(bias + HALF).to(gl.float32)
            pos = gl.load(I32 + positions_at + rows)
            slot = gl.load(I32 + slots_at + rows)
            angles = F32 + _region(rope_off) + pos[:, None] * HD + j[None, :]
            mask = (rows < 1)[:, None] & (j < HALF)[None, :]
            _store_head(_round(lo), _round(hi), head, rows, j, mask, _round(gl.load(angles)),
                        _round(gl.load(angles + HALF)), W, ACT, KV, kv_plane, HQ, HKV, q_norm_off, k_norm_off, qk_eps,
                        q_out_off, layer, has_qk_norm, step_kv_off, slot, HD)
    return i


@gluon.jit
def qkv_row(desc):
    """A QKV descriptor row's words, as QKV_USED names them (HQ, HKV for the heads' counts)."""
    K = gl.load(desc + QKV_WORDS[1]).to(gl.int32)
    HQ, HKV = gl.load(desc + QKV_WORDS[3]).to(gl.int32), gl.load(desc + QKV_WORDS[4]).to(gl.int32)
    eps = gl.load(desc + QKV_WORDS[6]).to(gl.float64, bitcast=True).to(gl.float32)
    qk_eps = gl.load(desc + QKV_WORDS[10]).to(gl.float64, bitcast=True).to(gl.float32)
    return gl.load(desc + QKV_WORDS[0]), K, gl.load(desc + QKV_WORDS[2]), HQ, HKV, gl.load(desc + QKV_WORDS[5]), eps, \
        gl.load(desc + QKV_WORDS[7]), gl.load(desc + QKV_WORDS[8]), gl.load(desc + QKV_WORDS[9]), qk_eps, \
        gl.load(desc + QKV_WORDS[11]), gl.load(desc + QKV_WORDS[12]), gl.load(desc + QKV_WORDS[13]), \
        gl.load(desc + QKV_WORDS[14]), gl.load(desc + QKV_WORDS[15]), gl.load(desc + QKV_WORDS[16]), \
        gl.load(desc + QKV_WORDS[17])


@gluon.jit
def qkv_gemv(DESCS, W, ACT, F32, I32, KV, kv_plane, desc_index, units, positions_at, slots_at, GR: gl.constexpr,
             SLOTS_: gl.constexpr, HD: gl.constexpr, NORM_F64: gl.constexpr, DESC_WORDS: gl.constexpr,
             LOADER_REGS: gl.constexpr):
    """Row desc_index of DESCS (a QKV group's descriptor) over a step's one row, in `units` units of GR weight rows
    (HD / GR a head), the row's position and cache slot at I32[positions_at] and I32[slots_at]."""
    x_off, K, w_off, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, \
        has_qk_norm, step_kv_off, part_off, ticket_off = qkv_row(DESCS + desc_index * DESC_WORDS)
    w_desc, x_desc, w_ring, x_ring, ready, empty = _stream(W + w_off, (HQ + 2 * HKV) * HD, ACT + x_off, K, GR, SLOTS_)
    gl.warp_specialize([
        (_qkv_consumer, (W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, units, K, stats_off, eps,
                         bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm,
                         step_kv_off, part_off, ticket_off, positions_at, slots_at, SLOTS_, HD, NORM_F64)),
        (_loader, (w_desc, x_desc, w_ring, x_ring, ready, empty, units, K, SLOTS_)),
    ], [1], [LOADER_REGS])


def qkv_constexprs(rows: int, norm_f64: bool) -> dict:
    """A QKV launch's constexprs: units of `rows` weight rows (a divisor of the head's), the sums' type."""
    return dict(GR=rows, SLOTS_=SLOTS, HD=HEAD_DIM, NORM_F64=norm_f64, DESC_WORDS=DESC_WORDS, LOADER_REGS=LOADER_REGS)


def constexprs(rows: int, gated: bool, out_kind: int, norm_f64: bool) -> dict:
    """A launch's constexprs: units of `rows` weight rows (`rows_for`), the descriptor's gating and output kind, the
    sums' type."""
    return dict(GR=rows, SLOTS_=SLOTS, GATED=gated, OUT_KIND=out_kind, NORM_F64=norm_f64, DESC_WORDS=DESC_WORDS,
                LOADER_REGS=LOADER_REGS)


UNIT_ROWS = (32, 16, 8)  # GR: a slot of 1, 2 or 4 boxes


def rows_for(n: int, sms: int) -> int:
    """GR for a projection of n weight rows on `sms` SMs: the largest whose units give every program of two an SM
    one at least, in shares within 10% of even (a program's share is the floor or the ceiling of units / programs);
    else the one whose shares are most even."""
    def evenness(rows: int) -> float:
        units = -(-n // rows)
        share = units / min(units, PER_SM * sms)
        return share / -(-units // min(units, PER_SM * sms)) * min(1.0, units / (PER_SM * sms))
    for rows in UNIT_ROWS:
        if -(-n // rows) >= PER_SM * sms and evenness(rows) >= 0.9:
            return rows
    return max(UNIT_ROWS, key=evenness)


def grid(n: int, rows: int, sms: int) -> tuple[int, int]:
    """(units, programs) of a projection of n weight rows in units of `rows`."""
    units = -(-n // rows)
    return units, min(units, PER_SM * sms)


def unsupported(words: list[int]) -> str | None:
    """Why a LINEAR descriptor's group cannot run here in a one-row step (None: it can): outputs that are neither bf16
    rows nor the fp32 logits, a router, or an operand TMA cannot address (offsets and widths of 16 bytes)."""
    f = dict(zip(LINEAR_FIELDS, words))
    if f["out_kind"] not in (OUT_ALIGNED, OUT_F32):
        return "its outputs are rows of another width (a router's logits)"
    if f["route_ticket"] >= 0:
        return "it routes (a MoE router)"
    for name in ("x_off", "k", "w_off"):
        if f[name] % 8:
            return f"{name} {f[name]} is not a multiple of 8 elements"
    if f["gated"] and f["n"] % 2:
        return "its gated columns are odd"
    return None


def qkv_unsupported(words: list[int]) -> str | None:
    """Why a QKV descriptor's group cannot run here in a one-row step (None: it can): what the prefill body cannot
    take (`qkv.unsupported`), or no scratch for a head's row and tickets."""
    why = qkv.unsupported(words)
    if why:
        return why
    f = dict(zip(QKV_FIELDS, words))
    if f["part_off"] < 0 or f["ticket_off"] < 0 or f["part_off"] % qkv.ALIGN.value:
        return "it has no scratch for a head's row, or no tickets"
    return None
