"""A prefill step's layers as one persistent Gluon kernel: the bodies' groups one after another, events between them.

The host-driven executor launches each Gluon body as a kernel of its own, a group at a time. This kernel runs a run
of them (a step's QKV, attention, o_proj, gate/up and down groups, layer after layer) in one launch, as the persistent
megakernel runs its tasks: one program an SM walks the groups in order, taking its share of each group's work (tiles
pid, pid + P, ..., or attention's items as `attention.py` hands them out), and a group's event counter moves on by one
as each program finishes its share, so that the next group starts once the counter reaches the programs' count.

Two partitions, as every body: a loader warp and two consumer warp groups. The loader waits on the group before's
event, then copies the group's operands into a ring (`tiles.load_tiles`, `attention.load_items`), running ahead of
the consumers across tiles within a group; the consumers wait on the same event (their epilogues read the norms'
sums and residuals the groups before wrote), multiply and finish each tile or item (`linear.consume_tiles`,
`qkv.consume_tiles`, `attention.consume_items`), then drain their bulk stores and signal. Two rings over the same
160 KB (4 [128, 64] input chunks, 3 [256, 64] weight chunks), each body viewing it as its own: [128, 256] tiles in 3
stages and attention's 64-key halves in the same 3 (one ring: its barriers and slot count), [128, 128] tiles in 4
(the other; the table says which tiles a group takes, as `linear.tiles_for` picks for the group kernels: in 3 stages
they lost a quarter). Both partitions count each ring's slots from 0 across the launch, so they agree on each slot's
phase whatever body filled it; the views overlap, which is safe because a group starts only once every program has
finished the group before (its loads, products and stores). One 64 KB staging buffer, viewed per body (a tile's
outputs, a gated tile's, QKV's heads).

Attention takes items of 128 rows with the step's keys whole (a step that prefills: no split). What the chain covers
and when is `runtime.gluon.GluonGroups.chain_groups`; the groups before and after it (embedding, the last norm
and LM head, sampling) stay the host-driven executor's.

H200, Llama-3-8B's first step (`benchmarks/gluon_groups.py`, session 64): the 192 groups of a 512-token prompt in
12.31 ms against 12.39 as the group kernels, of a 2,048-token one 41.77 against 41.29 (the whole step 12.60 and 42.09
ms; torch's prefill 15.02 and 55.02). All [128, 256] tiles: 14.75 ms at 512 tokens; [128, 128] ones in 3 stages where
they are picked: 15.11, and all of them: 15.64 and 56.49.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from codegen.gluon import attention, gemv, linear, qkv, step
from codegen.gluon.events import wait
from codegen.gluon.linear import BK, BM, LOADER_REGS
from codegen.gluon.tiles import load_tiles
from codegen.layout import STEP_LOG
from codegen.tasks import DESC_WORDS as ROW_WORDS

# a row of the chain's table: a group's kind, its descriptor row, and whether its tiles are [128, 128] (NARROW). The
# one-row chain's kinds past ATTENTION: LOGITS (a projection whose outputs are the fp32 logits: the LM head), and a
# step's rows around its layers (`step.py`)
PLAIN, GATED, QKV, ATTENTION, LOGITS, EMBED, GATHER, SAMPLE, PLAN = range(9)
KIND_NAMES = ("projection", "gated projection", "QKV", "attention", "LM head", "embedding", "logits row", "sampling",
              "plan")
_PLAIN, _GATED, _QKV, _ATTENTION, _LOGITS = (gl.constexpr(k) for k in (PLAIN, GATED, QKV, ATTENTION, LOGITS))
_EMBED, _GATHER, _SAMPLE, _PLAN = gl.constexpr(EMBED), gl.constexpr(GATHER), gl.constexpr(SAMPLE), gl.constexpr(PLAN)
ROW = 3  # (ints a row)
_ROW = gl.constexpr(ROW)
assert linear.WIDE.stages == attention.STAGES
STAGES, NARROW_STAGES = gl.constexpr(linear.WIDE.stages), gl.constexpr(linear.NARROW.stages)
WIDE_BN, NARROW_BN = gl.constexpr(linear.WIDE.bn), gl.constexpr(linear.NARROW.bn)
GROUP = gl.constexpr(8)
HD = gl.constexpr(attention.HEAD_DIM)
KEYS = gl.constexpr(attention.BLOCK)
IDS = gl.constexpr(attention.IDS)
MAX_SPLITS = gl.constexpr(attention.MAX_SPLITS)
LAUNCH = linear.LAUNCH
WORDS_A_ROW = gl.constexpr(ROW_WORDS)

SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "KV": "*bf16",
             "kv_plane": "i64", "kv_rows": "i32", "GROUPS": "*i32", "EVENTS": "*i32", "groups": "i32",
             "control_at": "i32", "positions_at": "i32", "slots_at": "i32", "seq_starts_at": "i32",
             "context_lens_at": "i32", "seq_req_at": "i32", "req_pages_at": "i32"}


@gluon.jit
def _signal(EVENTS, g):
    """This program's share of group g done: its bulk stores written and ordered before the generic accesses that
    follow, the staging buffer's reads before later copies into it, every consumer thread past them, then one
    release add."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0; fence.proxy.async.global; mov.u32 $0, $1;", "=r,r", [g],
                              dtype=gl.int32, is_pure=False, pack=1)
    fence_async_shared()
    gl.thread_barrier()
    gl.atomic_add(EVENTS + g, 1, sem="release", scope="gpu")


@gluon.jit
def _group(DESCS, GROUPS, g):
    """Row g of the chain's table: the group's kind, its descriptor row, whether its tiles are narrow."""
    return gl.load(GROUPS + _ROW * g), DESCS + gl.load(GROUPS + _ROW * g + 1) * WORDS_A_ROW, \
        gl.load(GROUPS + _ROW * g + 2) != 0


@gluon.jit
def _loader(DESCS, W, ACT, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, control_at, seq_starts_at,
            context_lens_at, seq_req_at, req_pages_at, a_ring, b_ring, ready, empty, narrow_b, narrow_ready,
            narrow_empty, k_ring, v_ring, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr):
    """Each group's operands into its ring once the group before is done."""
    num_rows = gl.load(I32 + control_at)
    i = 0  # (the 3-stage ring's slots)
    j = 0  # (the 4-stage ring's)
    for g in range(groups):
        kind, desc, narrow = _group(DESCS, GROUPS, g)
        if g > 0:
            wait(EVENTS, g - 1, gl.num_programs(0))
        if kind == _ATTENTION:
            _, _, H, HKV, layer, _, _, _, _ = attention.row(desc)
            i = attention.load_items(KV, kv_plane, kv_rows, I32, k_ring, v_ring, ready, empty, control_at,
                                     seq_starts_at, context_lens_at, seq_req_at, req_pages_at, layer, H // HKV, HKV, 1,
                                     i, HD, BM, PAGE, PAGES_PER_SEQ, MAX_SEQS, STAGES, IDS, False)
        elif narrow:
            j = _load_tiles(desc, kind == _QKV, W, ACT, num_rows, a_ring, narrow_b, narrow_ready, narrow_empty, j)
        else:
            i = _load_tiles(desc, kind == _QKV, W, ACT, num_rows, a_ring, b_ring, ready, empty, i)


@gluon.jit
def _load_tiles(desc, is_qkv, W, ACT, num_rows, a_ring, b_ring, ready, empty, i):
    """A projection's (QKV's where is_qkv) tiles into ring slots i .. (the ring's stages: its barriers'); returns the
    slot after them."""
    BN: gl.constexpr = b_ring.type.shape[1]
    RING: gl.constexpr = ready.type.shape[0]
    if is_qkv:
        x_desc, w_desc = qkv.inputs(desc, W, ACT, num_rows, HD, BM, BN)
        K, HQ, HKV, _, _, _, _, _, _, _, _, _, _, _ = qkv.row(desc)
        N = (HQ + 2 * HKV) * HD
    else:
        x_desc, w_desc = linear.inputs(desc, W, ACT, num_rows, BM, BN)
        K, N, _, _, _, _, _ = linear.row(desc)
    return load_tiles(x_desc, w_desc, a_ring, b_ring, ready, empty, i, gl.cdiv(num_rows, BM), gl.cdiv(N, BN), K,
                      RING, GROUP)


@gluon.jit
def _consumer(DESCS, W, ACT, F32, I32, KV, kv_plane, GROUPS, EVENTS, groups, control_at, positions_at, slots_at,
              seq_starts_at, context_lens_at, seq_req_at, req_pages_at, a_ring, b_ring, ready, empty, narrow_b,
              narrow_ready, narrow_empty, k_ring, v_ring, staging, res_bar, PAGE: gl.constexpr,
              PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, NORM_F64: gl.constexpr):
    """Each group's products and epilogues once the group before is done, then the group's signal."""
    wide = _outputs(staging, WIDE_BN)
    wide_gated = _outputs(staging, WIDE_BN // 2)
    narrow = _outputs(staging, NARROW_BN)
    narrow_gated = _outputs(staging, NARROW_BN // 2)
    # (QKV's heads: 16-byte units swizzled by the row, `qkv.qkv_prefill`'s staging)
    wide_heads = staging._reinterpret(gl.bfloat16, [BM, WIDE_BN], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    narrow_heads = staging._reinterpret(gl.bfloat16, [BM, NARROW_BN], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    num_rows = gl.load(I32 + control_at)
    i = 0  # (the 3-stage ring's slots)
    j = 0  # (the 4-stage ring's)
    phase = 0
    for g in range(groups):
        kind, desc, is_narrow = _group(DESCS, GROUPS, g)
        if g > 0:
            wait(EVENTS, g - 1, gl.num_programs(0))
        if kind == _ATTENTION:
            i = _attention(desc, ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at,
                           context_lens_at, seq_req_at, req_pages_at, i, PAGE, PAGES_PER_SEQ, MAX_SEQS)
        elif kind == _QKV:
            if is_narrow:
                j = _qkv(desc, W, ACT, F32, I32, KV, kv_plane, a_ring, narrow_b, narrow_ready, narrow_empty,
                         narrow_heads, num_rows, positions_at, slots_at, j, NORM_F64)
            else:
                i = _qkv(desc, W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, wide_heads, num_rows,
                         positions_at, slots_at, i, NORM_F64)
        elif kind == _GATED:
            if is_narrow:
                j, phase = _linear(desc, W, ACT, F32, a_ring, narrow_b, narrow_ready, narrow_empty, narrow_gated,
                                   res_bar, num_rows, j, phase, True, NORM_F64)
            else:
                i, phase = _linear(desc, W, ACT, F32, a_ring, b_ring, ready, empty, wide_gated, res_bar, num_rows, i,
                                   phase, True, NORM_F64)
        else:
            if is_narrow:
                j, phase = _linear(desc, W, ACT, F32, a_ring, narrow_b, narrow_ready, narrow_empty, narrow, res_bar,
                                   num_rows, j, phase, False, NORM_F64)
            else:
                i, phase = _linear(desc, W, ACT, F32, a_ring, b_ring, ready, empty, wide, res_bar, num_rows, i, phase,
                                   False, NORM_F64)
        _signal(EVENTS, g)


@gluon.jit
def _outputs(staging, OUT: gl.constexpr):
    """The staging buffer as a projection tile's [BM, OUT] outputs."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, OUT], gl.bfloat16)
    return staging._reinterpret(gl.bfloat16, [BM, OUT], layout)


@gluon.jit
def _attention(desc, ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at,
               seq_req_at, req_pages_at, i, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr):
    q_off, out_off, H, HKV, _, scale, _, part_off, ticket_off = attention.row(desc)
    return attention.consume_items(ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at,
                                   context_lens_at, seq_req_at, req_pages_at, q_off, out_off, H, HKV, scale, 1,
                                   part_off, ticket_off, i, HD, BM, PAGE, PAGES_PER_SEQ, MAX_SEQS, STAGES, False,
                                   16, MAX_SPLITS)


@gluon.jit
def _qkv(desc, W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, heads, num_rows, positions_at, slots_at,
         i, NORM_F64: gl.constexpr):
    BN: gl.constexpr = b_ring.type.shape[1]
    RING: gl.constexpr = ready.type.shape[0]
    K, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm, \
        step_kv_off = qkv.row(desc)
    return qkv.consume_tiles(W, ACT, F32, I32, KV, kv_plane, a_ring, b_ring, ready, empty, heads,
                             gl.cdiv(num_rows, BM), gl.cdiv((HQ + 2 * HKV) * HD, BN), num_rows, K, stats_off, eps,
                             bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off,
                             has_qk_norm, step_kv_off, positions_at, slots_at, i, HD, RING, GROUP, NORM_F64)


@gluon.jit
def _linear(desc, W, ACT, F32, a_ring, b_ring, ready, empty, c_smem, res_bar, num_rows, i, phase,
            GATED: gl.constexpr, NORM_F64: gl.constexpr):
    BN: gl.constexpr = b_ring.type.shape[1]
    RING: gl.constexpr = ready.type.shape[0]
    OUT: gl.constexpr = c_smem.type.shape[1]
    layout: gl.constexpr = c_smem.type.layout
    K, N, stats_off, eps, res_off, bias_off, out_stats_off = linear.row(desc)
    o_desc, r_desc = linear.outputs(desc, ACT, num_rows, BM, OUT, layout, GATED)
    return linear.consume_tiles(W, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar,
                                gl.cdiv(num_rows, BM), gl.cdiv(N, BN), num_rows, N, K, stats_off, eps, res_off,
                                bias_off, out_stats_off, i, phase, RING, GROUP, GATED, NORM_F64)


@gluon.jit
def _barriers(STAGES: gl.constexpr):
    """A ring's `ready` and `empty` barriers, a pair a slot."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return ready, empty


@gluon.jit
def prefill_chain(DESCS, W, ACT, F32, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, control_at, positions_at,
                  slots_at, seq_starts_at, context_lens_at, seq_req_at, req_pages_at, PAGE: gl.constexpr,
                  PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, NORM_F64: gl.constexpr,
                  LOADER_REGS: gl.constexpr):
    """The `groups` rows of GROUPS (kind, descriptor row of DESCS, narrow) over the step planned in I32 (its tokens at
    I32[control_at], their positions and cache slots, the sequences' first tokens, contexts and requests, the requests'
    page tables at the *_at words), one after another; EVENTS: a counter a group, zero at the launch. The cache KV:
    kv_rows rows of a token's every KV head, a layer's keys (then values) kv_plane elements apart. One program an SM
    (the grid must be co-resident: each program waits for all of them)."""
    # [128, 64] input chunks: 4 slots, of which [128, 256] tiles take 3; their [256, 64] weight chunks in 3 slots
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [NARROW_STAGES, BM, BK],
                                       gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16))
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, WIDE_BN, BK],
                                       gl.NVMMASharedLayout.get_default_for([WIDE_BN, BK], gl.bfloat16))
    ready, empty = _barriers(STAGES)
    # [128, 128] tiles' [128, 64] weight chunks in the latter's first 64 KB, 4 stages
    narrow_b = b_ring._reinterpret(gl.bfloat16, [2 * STAGES, NARROW_BN, BK],
                                   gl.NVMMASharedLayout.get_default_for([NARROW_BN, BK], gl.bfloat16))
    narrow_ready, narrow_empty = _barriers(NARROW_STAGES)
    # attention's key and value halves, two a slot each, in the 3-stage ring's slots
    halves: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HD // 2], gl.bfloat16)
    k_ring = a_ring._reinterpret(gl.bfloat16, [2 * NARROW_STAGES, KEYS, HD // 2], halves)
    v_ring = b_ring._reinterpret(gl.bfloat16, [4 * STAGES, KEYS, HD // 2], halves)  # (its first half)
    staging = gl.allocate_shared_memory(gl.bfloat16, [BM, WIDE_BN], gl.NVMMASharedLayout.get_default_for(
        [BM, WIDE_BN], gl.bfloat16))
    res_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(res_bar.index(0), count=1)
    gl.warp_specialize([
        (_consumer, (DESCS, W, ACT, F32, I32, KV, kv_plane, GROUPS, EVENTS, groups, control_at, positions_at, slots_at,
                     seq_starts_at, context_lens_at, seq_req_at, req_pages_at, a_ring, b_ring, ready, empty, narrow_b,
                     narrow_ready, narrow_empty, k_ring, v_ring, staging, res_bar, PAGE, PAGES_PER_SEQ, MAX_SEQS,
                     NORM_F64)),
        (_loader, (DESCS, W, ACT, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, control_at, seq_starts_at,
                   context_lens_at, seq_req_at, req_pages_at, a_ring, b_ring, ready, empty, narrow_b, narrow_ready,
                   narrow_empty, k_ring, v_ring, PAGE, PAGES_PER_SEQ, MAX_SEQS)),
    ], [1], [LOADER_REGS])


def constexprs(page_size: int, pages_per_seq: int, max_batch: int, norm_f64: bool) -> dict:
    return dict(PAGE=page_size, PAGES_PER_SEQ=pages_per_seq, MAX_SEQS=max(32, 1 << (max_batch - 1).bit_length()),
                NORM_F64=norm_f64, LOADER_REGS=LOADER_REGS)


# -- a one-row step's layers (batch-1 decode) ------------------------------------------------------------------------
# The GEMV's units (`gemv.py`: GR weight rows over all of K, contiguous shares, two programs an SM, one consumer warp
# group) and split decode attention (`attention.py`: 64-row items on that warp group, a pair's keys in splits merged by
# the last to finish). 96 KB of shared memory a program, two rings over it: the GEMV's weight boxes in SLOTS slots, and
# attention's key and value halves interleaved in 3 (a slot's k halves then its v halves, `attention.load_items`' KS 4,
# V_OFF 2), each ring with its own barriers and slot count. The loader copies a group's first units' weights before the
# group before is done (they do not depend on it) and their row's boxes after (`benchmarks/explore/ws_decode_chain.py`,
# EARLY: 105.2 against 108.4 us a layer for o_proj -> gate/up -> down), and attention's keys before the step's own
# likewise (only a slot that holds the step's keys waits: `attention.load_items`); a ring's first copies wait until
# the consumers have released the other ring's slots (the views overlap).
# H200, Llama-3-8B's batch-1 decode step at context 512 (session 65, `benchmarks/gluon_groups.py --decode 1x512`):
# the 192 groups of the 32 layers in 3,928 us against 4,782 as Gluon group kernels (1.22x); the step's launches from
# one CUDA graph 3.96 ms against the persistent Triton megakernel's TPOT of 4.51; the chain alone 3,721 us launched
# again and again (`benchmarks/explore/chain_probe.py`, which also says where a stuck chain's programs are). A layer,
# traced: QKV 12.6 us, attention 9.6, o_proj 11.5, gate/up 54.6, down 29.2 (medians, from the event before to its
# own). The host-driven executor takes it with `chain` (`GluonCoverage.one_row_chain`).
# Over steps (`steps` > 1, the table from `GluonCoverage.loop_rows`): a step's plan first (program 0, `step.plan_rows`),
# then its embedding, layers, the row that needs logits, the LM head (LOGITS) and sampling, step after step in
# one launch, each group's event its own (group g of step s at EVENTS[s groups + g]), until a plan leaves no step of
# one row. It ran right the first time (session 66): Llama-3-8B at context 512, a step 4.035 ms; through the runtime
# (`runtime.gluon.OneRequest`, a request's decode steps) TPOT 3.97 ms, 90% of the read bandwidth, 1.47x torch's graph.
# Its first version hung (session 64): every unit after a program's first went on from the first's early slots, since
# `k_first = 0` in the loop did not reset a name that held a tensor before it (Gluon carried the tensor), and the
# consumers waited for slots never filled. Start values are computed in the loop now (`gl.where`).

DECODE_LAUNCH = gemv.LAUNCH
GK_ = gl.constexpr(gemv.GK.value)
SLOT_ROWS_ = gl.constexpr(gemv.SLOT_ROWS.value)
GR_ITEM = gl.constexpr(16 * gemv.CONSUMER_WARPS)  # attention's item rows: 16 a consumer warp


@gluon.jit
def _gemv_operands(desc, is_qkv):
    """A one-row projection's descriptor words: its row's and weight's offsets, K and the weight's rows."""
    if is_qkv:
        x_off, K, w_off, HQ, HKV, _, _, _, _, _, _, _, _, _, _, _, _, _ = gemv.qkv_row(desc)
        N = (HQ + 2 * HKV) * HD
    else:
        x_off, K, w_off, N, _, _, _, _, _, _ = gemv.linear_row(desc)
    return x_off, K, w_off, N


@gluon.jit
def _stream_descs(W, w_off, N, ACT, x_off, K, GR: gl.constexpr):
    """The weight's [N, K] rows and the row's [1, K] as tensor descriptors of [GR, GK] and [1, GK] boxes."""
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    w_desc = tma.make_tensor_descriptor(W + w_off, [N, K], [K.to(gl.int64), 1], [GR, GK_], plain)
    x_desc = tma.make_tensor_descriptor(ACT + x_off, [1, K], [K.to(gl.int64), 1], [1, GK_], plain)
    return w_desc, x_desc


@gluon.jit
def _stamp(EVENTS, events, word: gl.constexpr, value, TRACING: gl.constexpr):
    """(TRACING) word `word` of this program's 8 after the chain's `events` counters: where its partitions are (words
    0-2 the loader's event, stage and slot count, 4-6 the consumers'), for a host that reads them while it runs."""
    if TRACING:
        gl.store(EVENTS + events + gl.program_id(0) * 8 + word, value)


CLOCKS = gl.constexpr(4)  # (`_clock`'s words a program an event)


@gluon.jit
def _clock(EVENTS, events, e, word: gl.constexpr, TRACING: gl.constexpr):
    """(TRACING) the global timer's low 32 bits (ns) as word `word` of event e's CLOCKS for this program, after the
    stamps: 0 the loader past the event before, 1 the consumers' signal; the batched chain's narrow groups also 2,
    the consumers past the event before, and 3, their products done (`batch._narrow_linear`, `_narrow_qkv`)."""
    if TRACING:
        now = gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r,r", [e], dtype=gl.int32, is_pure=False,
                                        pack=1)
        gl.store(EVENTS + events + gl.num_programs(0) * 8 + (gl.program_id(0) * events + e) * CLOCKS + word, now)


@gluon.jit
def _released(empty, i, before, SLOTS_: gl.constexpr):
    """Waits until the consumers have released every ring slot use below `before` among the last SLOTS_ of the i
    issued (the older ones were released before their slots were copied into again)."""
    for k in gl.static_range(SLOTS_):
        j = i - SLOTS_ + k
        if (j >= 0) & (j < before):
            mbarrier.wait(empty.index(j % SLOTS_), (j // SLOTS_) & 1)


@gluon.jit
def _go():
    """A loop's handoff of its plans' decisions from a program's consumers to its loader (`_hand`, `_handed`): a word
    of shared memory and its barrier."""
    go = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    go_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(go_bar.index(0), count=1)
    return go, go_bar


@gluon.jit
def _hand(go, go_bar, running):
    """The consumers' decision whether the loop goes on past a plan (`_runs`), handed to their loader: each reading
    the host's stop word for itself, one could stop while the other went on, waiting on the ring for ever."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    go.store(gl.full([1], running, gl.int32, layout))
    gl.thread_barrier()  # (every consumer warp's store before the arrive that publishes it)
    mbarrier.arrive(go_bar.index(0), count=1)


@gluon.jit
def _handed(go, go_bar, plans):
    """The loader's copy of its consumers' decision at its `plans`-th plan (`_hand`); returns it and plans + 1."""
    mbarrier.wait(go_bar.index(0), plans & 1)
    running = gl.sum(go.load(gl.BlockedLayout([1], [32], [1], [0])), axis=0)
    return running, plans + 1


@gluon.jit
def _runs(I32, REGIONS, EVENTS):
    """Whether the step just planned is one the loop runs: a step of one token of one sequence (1), or not (0: every
    request has finished, the step is another shape, which the host runs, or the host asked the launch to stop)."""
    control = I32 + gl.load(REGIONS + step.CONTROL)
    return ((gl.load(control + 2) == 0) & (gl.load(control) == 1) & (gl.load(control + 1) == 1) &
            (gl.load(EVENTS - 1, volatile=True) == 0)).to(gl.int32)  # (the stop word: `events.stopped`)


@gluon.jit
def _decode_loader(DESCS, W, ACT, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, steps, REGIONS, control_at,
                   seq_starts_at, context_lens_at, seq_req_at, req_pages_at, w_ring, x_ring, kv, ready, empty,
                   kv_ready, kv_empty, go, go_bar, GR: gl.constexpr, SLOTS_: gl.constexpr, PAGE: gl.constexpr,
                   PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, SPLIT_SLOTS: gl.constexpr,
                   TRACING: gl.constexpr):
    """Each group's boxes into the ring, step after step: a projection's first slots' weights before the group
    before is done, the rest after it; attention's keys and values before it, but for the slots that hold the step's
    own keys. A step's plan: past its event, whether the loop goes on, as the consumers decided (`_handed`)."""
    P = gl.num_programs(0)
    events = steps * groups
    plans = gl.to_tensor(0)
    i = gl.to_tensor(0)  # (the GEMV ring's slots)
    j = gl.to_tensor(0)  # (attention's)
    ends = gl.to_tensor(0)  # the slots issued by the end of the group before, and of the one before that
    ends_before = gl.to_tensor(0)
    running = gl.to_tensor(1)
    for e in range(events):
        if running != 0:
            kind, desc, unused = _group(DESCS, GROUPS, e % groups)
            _stamp(EVENTS, events, 0, e + 1, TRACING)
            _stamp(EVENTS, events, 1, 0, TRACING)
            _stamp(EVENTS, events, 2, i, TRACING)
            if kind == _PLAN:
                wait(EVENTS, e, P)
                running, plans = _handed(go, go_bar, plans)
            elif kind == _ATTENTION:
                # its items' keys before the step's own go in before the group before is done (their slots' bytes
                # are the GEMV ring's: once read); a slot with the step's keys waits for it (`attention.load_items`)
                _released(empty, i, i, SLOTS_)
                _stamp(EVENTS, events, 1, 1, TRACING)
                _clock(EVENTS, events, e, 0, TRACING)
                j = decode_attention_loads(desc, KV, kv_plane, kv_rows, I32, kv, kv_ready, kv_empty, control_at,
                                           seq_starts_at, context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e,
                                           PAGE, PAGES_PER_SEQ, MAX_SEQS, SPLIT_SLOTS)
            elif (kind <= _QKV) | (kind == _LOGITS):  # (a projection)
                i = _gemv_loads(desc, kind == _QKV, W, ACT, w_ring, x_ring, ready, empty, kv_empty, i, j,
                                ends_before, EVENTS, events, e, GR, SLOTS_, TRACING)
            _stamp(EVENTS, events, 1, 6, TRACING)
            _stamp(EVENTS, events, 2, i, TRACING)
            ends_before = ends
            ends = i


@gluon.jit
def _gemv_loads(desc, is_qkv, W, ACT, w_ring, x_ring, ready, empty, kv_empty, i, j, ends_before, EVENTS, events, e,
                GR: gl.constexpr, SLOTS_: gl.constexpr, TRACING: gl.constexpr):
    """A one-row projection's boxes from ring slot i on: its first unit's first slots' weights, then (the group before
    done) their row's boxes and the rest; returns the slot after them. Its tensor descriptors go where the group two
    before had its own, once that group's copies are done."""
    BOXES: gl.constexpr = SLOT_ROWS_ // GR
    x_off, K, w_off, N = _gemv_operands(desc, is_qkv)
    _released(kv_empty, j, j, STAGES)  # (attention's slots, over the same bytes, read)
    _released(empty, i, ends_before, SLOTS_)
    _stamp(EVENTS, events, 1, 1, TRACING)
    if e % 2 == 0:
        w_desc, x_desc = _stream_descs(W, w_off, N, ACT, x_off, K, GR)
    else:
        w_desc, x_desc = _stream_descs(W, w_off, N, ACT, x_off, K, GR)
    _stamp(EVENTS, events, 1, 2, TRACING)
    u0, u1 = gemv._units(gl.cdiv(N, GR))
    first = gl.where(u1 > u0, gl.minimum(SLOTS_ * BOXES * GK_, K), 0)
    i0 = i
    for k0 in range(0, first, BOXES * GK_):
        i = gemv.fill_slot(w_desc, x_desc, w_ring, x_ring, ready, empty, i, u0, k0, SLOTS_, False)
    _stamp(EVENTS, events, 1, 3, TRACING)
    wait(EVENTS, e - 1, gl.num_programs(0))
    _stamp(EVENTS, events, 1, 4, TRACING)
    _clock(EVENTS, events, e, 0, TRACING)
    for k0 in range(0, first, BOXES * GK_):
        gemv.copy_row(x_desc, x_ring, ready, i0 + k0 // (BOXES * GK_), k0, SLOTS_)
    for u in range(u0, u1):
        # (the start as a tensor each unit: a tensor name set to a Python int in a `for` loop is not carried, and
        # every unit went on from `first`, short of the slots the consumers wait for: session 65's hang)
        for k0 in range(gl.where(u == u0, first, 0), K, BOXES * GK_):
            i = gemv.fill_slot(w_desc, x_desc, w_ring, x_ring, ready, empty, i, u, k0, SLOTS_, True)
    return i


@gluon.jit
def _decode_consumer(DESCS, W, ACT, F32, I32, KV, kv_plane, GROUPS, EVENTS, groups, steps, first_step, REGIONS,
                     stats_off, stats_size, control_at, positions_at, slots_at, seq_starts_at, context_lens_at,
                     seq_req_at, req_pages_at, w_ring, x_ring, kv, ready, empty, kv_ready, kv_empty, go, go_bar,
                     GR: gl.constexpr, SLOTS_: gl.constexpr, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr,
                     MAX_SEQS: gl.constexpr, NORM_F64: gl.constexpr, PART_ROWS: gl.constexpr,
                     SPLIT_SLOTS: gl.constexpr, MAX_TOKENS: gl.constexpr, REQS: gl.constexpr,
                     STEP_LOG: gl.constexpr, VB: gl.constexpr, WB: gl.constexpr, MAX_NEW: gl.constexpr,
                     SAMPLING: gl.constexpr, TRACING: gl.constexpr):
    """Each group's units, items or rows, the waits where they read what the group before wrote, then the group's
    signal, step after step; a step's plan by program 0, then (its event) whether the loop goes on, handed to the
    loader (`_hand`)."""
    P = gl.num_programs(0)
    events = steps * groups
    i = gl.to_tensor(0)  # (the GEMV ring's slots)
    j = gl.to_tensor(0)  # (attention's)
    running = gl.to_tensor(1)
    for e in range(events):
        if running != 0:
            kind, desc, unused = _group(DESCS, GROUPS, e % groups)
            _stamp(EVENTS, events, 4, e + 1, TRACING)
            _stamp(EVENTS, events, 5, 1, TRACING)
            _stamp(EVENTS, events, 6, i, TRACING)
            if kind == _ATTENTION:  # (an item's queries once the group before is done: `attention.consume_items`)
                j = decode_attention_items(desc, ACT, F32, I32, kv, kv_ready, kv_empty, control_at, seq_starts_at,
                                           context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e, PAGE,
                                           PAGES_PER_SEQ, MAX_SEQS, SPLIT_SLOTS, PART_ROWS)
            elif kind == _QKV:
                i = _decode_qkv(desc, W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, positions_at,
                                slots_at, i, EVENTS, e, SLOTS_, NORM_F64)
            elif kind == _GATED:
                i = _decode_linear(desc, W, ACT, F32, w_ring, x_ring, ready, empty, i, EVENTS, e, SLOTS_, True, 0,
                                   NORM_F64)
            elif kind == _PLAIN:
                i = _decode_linear(desc, W, ACT, F32, w_ring, x_ring, ready, empty, i, EVENTS, e, SLOTS_, False, 0,
                                   NORM_F64)
            elif kind == _LOGITS:
                i = _decode_linear(desc, W, ACT, F32, w_ring, x_ring, ready, empty, i, EVENTS, e, SLOTS_, False, 1,
                                   NORM_F64)
            else:  # a step's rows around its layers (`step.py`): what they read, the group before wrote
                wait(EVENTS, e - 1, P)
                _step_group(kind, desc, W, ACT, F32, I32, REGIONS, first_step + e // groups, stats_off, stats_size,
                            1, PAGES_PER_SEQ, PAGE, MAX_TOKENS, REQS, STEP_LOG, VB, WB, MAX_NEW, SAMPLING, NORM_F64)
            _stamp(EVENTS, events, 5, 2, TRACING)
            _stamp(EVENTS, events, 6, i, TRACING)
            _signal(EVENTS, e)
            _clock(EVENTS, events, e, 1, TRACING)
            _stamp(EVENTS, events, 5, 3, TRACING)
            if kind == _PLAN:
                wait(EVENTS, e, P)
                running = _runs(I32, REGIONS, EVENTS)
                _hand(go, go_bar, running)


@gluon.jit
def decode_attention_loads(desc, KV, kv_plane, kv_rows, I32, kv, kv_ready, kv_empty, control_at, seq_starts_at,
                           context_lens_at, seq_req_at, req_pages_at, j, EVENTS, e, PAGE: gl.constexpr,
                           PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, SPLIT_SLOTS: gl.constexpr):
    """A decode loop's attention group's keys and values into `kv` (its ring's slots, kv_ready's count of them: a
    slot's key halves then its value halves) from slot j on, items of GR_ITEM rows, the older keys before the group
    before is done (`attention.load_items`); returns the slot after them."""
    SLOTS: gl.constexpr = kv_ready.type.shape[0]
    _, _, H, HKV, layer, _, splits, _, _ = attention.row(desc)
    return attention.load_items(KV, kv_plane, kv_rows, I32, kv, kv, kv_ready, kv_empty, control_at, seq_starts_at,
                                context_lens_at, seq_req_at, req_pages_at, layer, H // HKV, HKV, splits, j, HD,
                                GR_ITEM, PAGE, PAGES_PER_SEQ, MAX_SEQS, SLOTS, IDS, SPLIT_SLOTS, 4, 2, EVENTS, e)


@gluon.jit
def decode_attention_items(desc, ACT, F32, I32, kv, kv_ready, kv_empty, control_at, seq_starts_at, context_lens_at,
                           seq_req_at, req_pages_at, j, EVENTS, e, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr,
                           MAX_SEQS: gl.constexpr, SPLIT_SLOTS: gl.constexpr, PART_ROWS: gl.constexpr):
    """`decode_attention_loads`' items: each one's queries once the group before is done, its online softmax over
    the ring's slots from j on, its outputs or its split's partial (`attention.consume_items`); returns the slot
    after them."""
    SLOTS: gl.constexpr = kv_ready.type.shape[0]
    q_off, out_off, H, HKV, _, scale, splits, part_off, ticket_off = attention.row(desc)
    return attention.consume_items(ACT, F32, I32, kv, kv, kv_ready, kv_empty, control_at, seq_starts_at,
                                   context_lens_at, seq_req_at, req_pages_at, q_off, out_off, H, HKV, scale, splits,
                                   part_off, ticket_off, j, HD, GR_ITEM, PAGE, PAGES_PER_SEQ, MAX_SEQS, SLOTS,
                                   SPLIT_SLOTS, PART_ROWS, MAX_SPLITS, 4, 2, EVENTS, e)


@gluon.jit
def _step_group(kind, desc, W, ACT, F32, I32, REGIONS, step_number, stats_off, stats_size, rows,
                PAGES_PER_SEQ: gl.constexpr, PAGE: gl.constexpr, MAX_TOKENS: gl.constexpr, REQS: gl.constexpr,
                STEP_LOG: gl.constexpr, VB: gl.constexpr, WB: gl.constexpr, MAX_NEW: gl.constexpr,
                SAMPLING: gl.constexpr, NORM_F64: gl.constexpr, SAMPLES: gl.constexpr = True):
    """A step's plan (program 0), its embedding rows, the rows that need its logits, or (SAMPLES: where the caller
    does not sample itself) its sampling; `rows`: the step's (a step that only decodes: its tokens are its
    sequences)."""
    if kind == _PLAN:
        step.zero_words(F32, stats_off, stats_size)
        if gl.program_id(0) == 0:
            step.plan_rows(I32, REGIONS, step_number, PAGES_PER_SEQ, PAGE, MAX_TOKENS, REQS, STEP_LOG)
    elif kind == _EMBED:  # (EMBED_FIELDS: the table, the rows' width, the step's rows, their norm's sums)
        step.copy_rows(W, gl.load(desc), I32 + gl.load(REGIONS + step.INPUT_IDS), rows, ACT, F32, gl.load(desc + 1),
                       gl.load(desc + 2), gl.load(desc + 3), NORM_F64)
    elif kind == _GATHER:  # (GATHER_FIELDS: the rows, the width, the rows' copy, their norm's sums)
        step.copy_rows(ACT, gl.load(desc), I32 + gl.load(REGIONS + step.LOGITS_ROWS), rows, ACT, F32,
                       gl.load(desc + 1), gl.load(desc + 2), gl.load(desc + 3), NORM_F64)
    elif SAMPLES:
        step.sample(desc, I32, F32, REGIONS, rows, VB, WB, MAX_NEW, SAMPLING)


@gluon.jit
def _decode_linear(desc, W, ACT, F32, w_ring, x_ring, ready, empty, i, EVENTS, e, SLOTS_: gl.constexpr,
                   GATED: gl.constexpr, OUT_KIND: gl.constexpr, NORM_F64: gl.constexpr):
    GR: gl.constexpr = w_ring.type.shape[1]
    _, K, _, N, out_off, stats_off, eps, res_off, bias_off, out_stats_off = gemv.linear_row(desc)
    u0, u1 = gemv._units(gl.cdiv(N, GR))
    return gemv.linear_units(W, ACT, F32, w_ring, x_ring, ready, empty, u0, u1, i, K, N, out_off, stats_off, eps,
                             res_off, bias_off, out_stats_off, SLOTS_, GATED, OUT_KIND, NORM_F64, EVENTS, e)


@gluon.jit
def _decode_qkv(desc, W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, positions_at, slots_at, i, EVENTS,
                e, SLOTS_: gl.constexpr, NORM_F64: gl.constexpr):
    GR: gl.constexpr = w_ring.type.shape[1]
    _, K, _, HQ, HKV, stats_off, eps, bias_off, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, \
        has_qk_norm, step_kv_off, part_off, ticket_off = gemv.qkv_row(desc)
    u0, u1 = gemv._units(gl.cdiv((HQ + 2 * HKV) * HD, GR))
    return gemv.qkv_units(W, ACT, F32, I32, KV, kv_plane, w_ring, x_ring, ready, empty, u0, u1, i, K, stats_off, eps,
                          bias_off, HQ, HKV, q_norm_off, k_norm_off, qk_eps, q_out_off, layer, rope_off, has_qk_norm,
                          step_kv_off, part_off, ticket_off, positions_at, slots_at, SLOTS_, HD, NORM_F64, EVENTS, e)


DECODE_SIGNATURE = {**SIGNATURE, "steps": "i32", "first_step": "i32", "REGIONS": "*i32", "stats_off": "i32",
                    "stats_size": "i32"}


@gluon.jit
def decode_chain(DESCS, W, ACT, F32, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, control_at, positions_at,
                 slots_at, seq_starts_at, context_lens_at, seq_req_at, req_pages_at, steps, first_step, REGIONS,
                 stats_off, stats_size, GR: gl.constexpr, SLOTS_: gl.constexpr, PAGE: gl.constexpr,
                 PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, NORM_F64: gl.constexpr,
                 PART_ROWS: gl.constexpr, LOADER_REGS: gl.constexpr, SPLIT_SLOTS: gl.constexpr = 1,
                 MAX_TOKENS: gl.constexpr = 1, REQS: gl.constexpr = 32, STEP_LOG: gl.constexpr = 4096,
                 VB: gl.constexpr = 1024, WB: gl.constexpr = 4096, MAX_NEW: gl.constexpr = 1,
                 SAMPLING: gl.constexpr = False, TRACING: gl.constexpr = False):
    """`prefill_chain`'s for steps of one row: the table's groups, `steps` times over (the chain's events a group a
    step: group g of step s at EVENTS[s groups + g]), the projections on the GEMV (GR-row units), attention with its
    keys in splits of SPLIT_SLOTS slots of keys at least (`attention._splits`), and where the table has them, a
    step's plan (its first group: the loop stops at a plan that leaves no step of one row), embedding, the row that
    needs logits, the LM head and sampling (`step.py`, SAMPLING: with temperatures; REGIONS the regions' offsets,
    `step.REGION_NAMES`; stats_off, stats_size: the F32 words a plan zeroes; the first step's number first_step).
    Two programs an SM, each waiting for all of them. TRACING: each program's partitions stamp where they are after
    the counters (`_stamp`), and the times of each group's event and signal after those (`_clock`; EVENTS then holds
    `steps groups` + 8 words a program + 2 a program a group a step)."""
    BOXES: gl.constexpr = SLOT_ROWS_ // GR
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    # allocated as attention's swizzled halves, which want their 1,024-byte alignment, and viewed as the GEMV's boxes
    halves: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, HD // 2], gl.bfloat16)
    kv = gl.allocate_shared_memory(gl.bfloat16, [4 * STAGES, KEYS, HD // 2], halves)
    w_ring = kv._reinterpret(gl.bfloat16, [SLOTS_ * BOXES, GR, GK_], plain)  # (the same 96 KB)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS_ * BOXES, 1, GK_], plain)
    ready, empty = _barriers(SLOTS_)
    kv_ready, kv_empty = _barriers(STAGES)
    go, go_bar = _go()
    gl.warp_specialize([
        (_decode_consumer, (DESCS, W, ACT, F32, I32, KV, kv_plane, GROUPS, EVENTS, groups, steps, first_step,
                            REGIONS, stats_off, stats_size, control_at, positions_at, slots_at, seq_starts_at,
                            context_lens_at, seq_req_at, req_pages_at, w_ring, x_ring, kv, ready, empty, kv_ready,
                            kv_empty, go, go_bar, GR, SLOTS_, PAGE, PAGES_PER_SEQ, MAX_SEQS, NORM_F64, PART_ROWS,
                            SPLIT_SLOTS, MAX_TOKENS, REQS, STEP_LOG, VB, WB, MAX_NEW, SAMPLING, TRACING)),
        (_decode_loader, (DESCS, W, ACT, I32, KV, kv_plane, kv_rows, GROUPS, EVENTS, groups, steps, REGIONS,
                          control_at, seq_starts_at, context_lens_at, seq_req_at, req_pages_at, w_ring, x_ring, kv,
                          ready, empty, kv_ready, kv_empty, go, go_bar, GR, SLOTS_, PAGE, PAGES_PER_SEQ, MAX_SEQS,
                          SPLIT_SLOTS, TRACING)),
    ], [1], [LOADER_REGS])


def decode_constexprs(rows: int, page_size: int, pages_per_seq: int, max_batch: int, norm_f64: bool,
                      part_rows: int, split_slots: int = 1, max_tokens: int = 1, sample_block: int = 1024,
                      max_new: int = 1, sample_wide: int = 4096, sampling: bool = False) -> dict:
    """`decode_chain`'s constexprs: units of `rows` weight rows, the step's paging, the sums' type, a split's partial
    rows (`CompileConfig.block_m`), a split's slots of keys at least; for a loop over steps the plan's token budget
    (`max_tokens_per_step`), the sampler's logits a pass (a power of two), the requests' output room
    (`max_new_tokens`), the sampling cut's passes' logits and its scratch (`codegen.lower.sample_wide`), and whether
    a request samples with a temperature (else the loop's sampler is greedy alone)."""
    return dict(GR=rows, SLOTS_=gemv.SLOTS, PAGE=page_size, PAGES_PER_SEQ=pages_per_seq,
                MAX_SEQS=max(32, 1 << (max_batch - 1).bit_length()), NORM_F64=norm_f64, PART_ROWS=part_rows,
                LOADER_REGS=gemv.LOADER_REGS, SPLIT_SLOTS=split_slots, MAX_TOKENS=max_tokens,
                REQS=max(32, 1 << (max_batch - 1).bit_length()), STEP_LOG=STEP_LOG, VB=sample_block, MAX_NEW=max_new,
                WB=sample_wide, SAMPLING=sampling)
