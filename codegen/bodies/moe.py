"""Mixture of experts: routing (softmax, top-k, renormalisation), each (token, choice) pair appended to its
expert's list as it is routed; the experts' gate/up projection (storing silu(gate) * up) and down projection
over their tokens, and the weighted combine (plus the residual).

Expert tasks are indexed by (expert slot, column tile): in a decode step slot j serves the j-th, (j+S)-th, ...
expert that received tokens this step, so a decode step with few active experts runs few real tiles; slots past
a decode step's most experts run only in steps that prefill (`codegen.lower`, `_moe_experts`). A prefill's
experts have many rows each: there a column block's tasks claim its row blocks one at a time (`claimed_blocks`).
"""
import triton
import triton.language as tl

from codegen.bodies.common import arrives_last, round_to, row_halves, word, word8, word_f32
from codegen.bodies.linear import row_inv_rms
from codegen.bodies.rows import store_rows

ROUTE_FIELDS = ("logits_off", "num_experts", "top_k", "normalize", "weights_off", "ids_off", "counts_off",
                "entries_off", "active_off", "capacity", "num_tasks")
EXPERT_FIELDS = ("x_off", "k", "w_off", "n", "out_off", "top_k", "counts_off", "entries_off", "active_off",
                 "num_experts", "num_slots", "num_tiles", "gated", "stats_off", "eps", "capacity", "claims_off",
                 "combine_rel", "combine_tickets", "decode_slots")
COMBINE_FIELDS = ("y_off", "weights_off", "top_k", "hidden", "out_off", "res_off", "out_stats_off")


@triton.jit
def router_routes(desc, tile, ACT, F32, I32, num_tokens, num_seqs, BN: tl.constexpr, EP: tl.constexpr,
                  TOPK: tl.constexpr):
    """After a router's task (a projection whose descriptor has `route_rel`, `moe_route_in_router`), in a step
    that only decodes: each of its column tiles' tasks takes the router's ticket, and the last routes the step's
    tokens one after another (`route_rows`, with the routing's descriptor `route_rel` words from the router's),
    so that the experts wait for the router, not for a routing group after it. (The tasks past the column
    tiles, which only prefill steps give work, do not arrive: the host-driven baseline runs them too.)"""
    route_rel = word(desc, 22)  # LINEAR_FIELDS' route_rel, route_ticket
    tiles = tl.cdiv(word(desc, 4), BN)
    if (route_rel != 0) & (num_tokens <= num_seqs) & (tile < tiles):
        if arrives_last(F32 + word(desc, 23), tiles):
            for row in range(0, num_tokens):
                route_rows(desc + route_rel, row, ACT, F32, I32, num_tokens, 1, EP, TOPK)


@triton.jit
def route_task(desc, tile, ACT, F32, I32, num_tokens, num_seqs, BM: tl.constexpr, EP: tl.constexpr,
               TOPK: tl.constexpr, LOOP_ROWS: tl.constexpr, IN_ROUTER: tl.constexpr):
    """Routes a token where the step has no more tokens than the group has tasks (every decode step: a token
    routed on each of as many programs), else BM tokens from tile * BM.

    A task with at most LOOP_ROWS tokens routes them one at a time. A [BM, EP] block of int64 keys spreads every
    row over all the threads, so each of its top-k reductions shuffles every row (~6,300 instructions, 1,476
    shuffles, sm_90, with the top-k unrolled); one row took ~630. A layer's routing runs on few programs, its
    code is never in the instruction cache, and fetching the block's took ~20 us a layer at b1 (ncu:
    `no_instructions`, H200).

    IN_ROUTER (`moe_route_in_router`): the router's tasks route a step that only decodes (`router_routes`); the
    host-driven baseline runs this group's tasks in such a step too, and they do nothing."""
    if IN_ROUTER:
        if num_tokens > num_seqs:
            route_step(desc, tile, ACT, F32, I32, num_tokens, BM, EP, TOPK, LOOP_ROWS)
    else:
        route_step(desc, tile, ACT, F32, I32, num_tokens, BM, EP, TOPK, LOOP_ROWS)


@triton.jit
def route_step(desc, tile, ACT, F32, I32, num_tokens, BM: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr,
               LOOP_ROWS: tl.constexpr):
    """`route_task`'s tokens: one, or BM from tile * BM."""
    one = num_tokens <= word(desc, 10)
    first = tl.where(one, tile, tile * BM)
    rows = tl.where(one, (tile < num_tokens).to(tl.int64), tl.minimum(num_tokens - first, BM))
    if (rows > LOOP_ROWS) & (rows > 1):
        route_rows(desc, first, ACT, F32, I32, num_tokens, BM, EP, TOPK)
    else:
        for row in range(first, first + rows):
            route_rows(desc, row, ACT, F32, I32, num_tokens, 1, EP, TOPK)


@triton.jit
def route_rows(desc, first, ACT, F32, I32, num_tokens, BM: tl.constexpr, EP: tl.constexpr, TOPK: tl.constexpr):
    """Softmax over the experts, the top k (and, with `normalize`, each chosen p over the sum of the chosen,
    as HF does) of tokens first .. first + BM. Each choice is one max over keys that pack a probability's bits
    (non-negative floats order as their bits do) above 65535 - expert, so that equal probabilities go to the
    lower expert, as `argmax` does; the choices stay in registers until their sum is known. (Two passes of
    argmax and max each took most of a routing task's ~30 us, on the critical path of every MoE layer, H100
    profile.) TOPK: the most experts a token takes, rounded up to a power of two. The caller passes rows that
    start inside the step (`route_task`)."""
    logits_off, E, K, normalize = word(desc, 0), word(desc, 1), word(desc, 2), word(desc, 3)
    weights_off, ids_off = word(desc, 4), word(desc, 5)
    rows = first + tl.arange(0, BM)
    row_ok = rows < num_tokens
    e = tl.arange(0, EP)
    logits = tl.load(ACT + logits_off + rows[:, None] * E + e[None, :], mask=row_ok[:, None] & (e < E)[None, :],
                     other=float("-inf")).to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, 1)[:, None])
    probs = probs / tl.sum(probs, 1)[:, None]
    keys = (probs.to(tl.int32, bitcast=True).to(tl.int64) << 16) | (65535 - e)[None, :]
    total = tl.zeros((BM,), tl.float32)
    chosen = tl.zeros((BM, TOPK), tl.int64)  # the chosen keys, column j the j-th choice
    slots = tl.arange(0, TOPK)
    # a loop, not unrolled: this code runs once a layer, fetched cold each time (H200, Qwen3-30B-A3B b1: the
    # token's task 16.4 us unrolled, 5.2 as a loop)
    for j in range(K):
        best = tl.max(keys, 1)
        total += (best >> 16).to(tl.int32).to(tl.float32, bitcast=True)
        chosen = tl.where(slots[None, :] == j, best[:, None], chosen)
        keys = tl.where(keys == best[:, None], -1, keys)
    p = (chosen >> 16).to(tl.int32).to(tl.float32, bitcast=True)
    weight = tl.where(normalize == 1, p / total[:, None], p)
    mask = row_ok[:, None] & (slots < K)[None, :]
    at = rows[:, None] * K + slots[None, :]
    expert = (65535 - (chosen & 65535)).to(tl.int32)
    tl.store(I32 + ids_off + at, expert, mask=mask)
    tl.store(ACT + weights_off + at, weight.to(ACT.dtype.element_ty), mask=mask)
    append_pairs(desc, F32, I32, expert, at.to(tl.int32), mask)


@triton.jit
def append_pairs(desc, F32, I32, expert, entry, mask):
    """Appends each (token, choice) entry to its expert's list (`capacity` words an expert: a token chooses an
    expert once): its place from the expert's count, and an expert's first entry also appends the expert to the
    list of those with any. The counts (then the number of listed experts) are words the planner zeroes every
    step, taken with atomics, so that no task waits for the others and a decode step routes its tokens side by
    side (before, the group's last task sorted the pairs by expert after routing its tokens one after the other:
    H200, Qwen3-30B-A3B b8, 38 us a layer against 6.5 now). The order of a list, and of the experts, varies from
    run to run; an expert's products for a row do not depend on it."""
    E, capacity = word(desc, 1), word(desc, 9)
    counts = (F32 + word(desc, 6)).to(tl.pointer_type(tl.int32), bitcast=True)
    place = tl.atomic_add(counts + expert, 1, mask=mask, sem="relaxed")
    first = mask & (place == 0)
    listed = tl.atomic_add(counts + E + expert * 0, 1, mask=first, sem="relaxed")
    tl.store(I32 + word(desc, 8) + listed, expert, mask=first)
    tl.store(I32 + word(desc, 7) + expert.to(tl.int64) * capacity + place, entry, mask=mask)


@triton.jit
def expert_task(desc, tile, W, ACT, F32, I32, num_tokens, num_seqs, BM: tl.constexpr, PM: tl.constexpr,
                TM: tl.constexpr, BN: tl.constexpr, PN: tl.constexpr, BK: tl.constexpr, EP: tl.constexpr,
                DOT_F32: tl.constexpr, STAGES: tl.constexpr, PM_STAGES: tl.constexpr, GEMV: tl.constexpr,
                PROGRAMS: tl.constexpr, CLAIMS: tl.constexpr, COMBINES: tl.constexpr, TOPK: tl.constexpr):
    """out[entry, cols] = x[row of entry] @ W[expert, cols]^T for the entries of this slot's experts.

    gate/up (`gated`): x is the hidden state, rows are tokens (entry // top_k); with `stats_off` the layer's
    RMSNorm is folded in (W's columns scaled by the norm's weight, each row's products by its 1/rms, as the
    projections do). Its weight rows alternate gate, up (`Lowering.placed_weight`), so a tile stores
    silu(gate) * up, half its width, and the SiLU-gating runs once an element. down: x is that, rows are entries.
    (With the gating in down's prologue, each of down's column tiles computed it again from gate/up's stored
    halves in fp32, in registers: H200, Qwen3-30B-A3B TTFT 2048 down ~1 ms a layer against gate/up's 0.77. Moving
    it here: b1 ctx512 4.18 -> 3.92 ms, b8 12.76 -> 11.02, b64 26.55 -> 22.13, TTFT 2048 371 -> 103.)

    The two are compiled apart (GATED), so that each block loads its inputs as the dots take them, with no
    select between the two paths: with the gating still in down, gate/up's own body alone took b8 from 12.78 to
    11.47 ms, and TTFT 2048 in 64-row blocks from 356 to 170 (benchmarks/RESULTS.md, session 39).

    COMBINES (some layer's down has `combine_rel`): in a step that only decodes, down's slot tasks of a column
    tile each take the tile's ticket, and the last combines the tile's columns (`combine_block`, with the
    combine's descriptor `combine_rel` words from this one); TOPK: the most experts a token takes."""
    if word(desc, 12) == 1:
        expert_slot(desc, tile, W, ACT, F32, I32, num_tokens, num_seqs, BM, PM, TM, BN, PN, BK, EP, DOT_F32,
                    STAGES, PM_STAGES, GEMV, PROGRAMS, CLAIMS, True)
    else:
        expert_slot(desc, tile, W, ACT, F32, I32, num_tokens, num_seqs, BM, PM, TM, BN, PN, BK, EP, DOT_F32,
                    STAGES, PM_STAGES, GEMV, PROGRAMS, CLAIMS, False)
        if COMBINES:
            rel = word(desc, 17)
            num_tiles = word(desc, 11)
            # (every slot task of a decode step arrives, the prefill-only slots past them excepted: the
            # host-driven baseline runs those too)
            if (rel != 0) & (num_tokens <= num_seqs) & (tile < word(desc, 19) * num_tiles):
                column = tile % num_tiles
                if arrives_last(F32 + word(desc, 18) + column, word(desc, 19)):
                    for m0 in range(0, num_tokens, BM):
                        combine_block(desc + rel, ACT, F32, num_tokens, m0, column * BN, BM, BN, TOPK)


@triton.jit
def expert_slot(desc, tile, W, ACT, F32, I32, num_tokens, num_seqs, BM: tl.constexpr, PM: tl.constexpr,
                TM: tl.constexpr, BN: tl.constexpr, PN: tl.constexpr, BK: tl.constexpr, EP: tl.constexpr,
                DOT_F32: tl.constexpr, STAGES: tl.constexpr, PM_STAGES: tl.constexpr, GEMV: tl.constexpr,
                PROGRAMS: tl.constexpr, CLAIMS: tl.constexpr, GATED: tl.constexpr):
    """With CLAIMS, a prefill step whose experts average more than BM rows takes [PM, PN] blocks claimed one
    at a time (`claimed_blocks`); every other step, and every step without CLAIMS, the slot's experts in turn
    (`slot_experts`)."""
    if CLAIMS:
        counts = (F32 + word(desc, 6)).to(tl.pointer_type(tl.int32), bitcast=True)  # route_rows' `append_pairs`
        num_active = tl.load(counts + word(desc, 9))
        if (num_tokens > num_seqs) & (num_tokens * word(desc, 5) > BM * num_active):
            claimed_blocks(desc, tile, W, ACT, F32, I32, counts, num_active, PM, TM, BN, PN, BK, EP, DOT_F32,
                           PM_STAGES, GATED)
        else:
            slot_experts(desc, tile, W, ACT, F32, I32, BM, PM, BN, BK, DOT_F32, STAGES, PM_STAGES, GEMV, PROGRAMS,
                         GATED)
    else:
        slot_experts(desc, tile, W, ACT, F32, I32, BM, PM, BN, BK, DOT_F32, STAGES, PM_STAGES, GEMV, PROGRAMS, GATED)


@triton.jit
def slot_experts(desc, tile, W, ACT, F32, I32, BM: tl.constexpr, PM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, PM_STAGES: tl.constexpr,
                 GEMV: tl.constexpr, PROGRAMS: tl.constexpr, GATED: tl.constexpr):
    """An expert task's experts in turn. Where the step's tiles fit in one wave of the PROGRAMS (a few tokens:
    each task's time is the layer's), an expert with one entry takes it as a GEMV (`expert_row`, with GEMV);
    else dots of BM rows, or of PM (where larger, pipelined PM_STAGES deep) for an expert with more than BM
    rows: each block reads the expert's weight slice whole."""
    x_off, K, w_off, N, out_off = word8(desc, 0), word8(desc, 1), word8(desc, 2), word8(desc, 3), word8(desc, 4)
    top_k = word(desc, 5)
    counts = (F32 + word(desc, 6)).to(tl.pointer_type(tl.int32), bitcast=True)  # route_rows' `append_pairs`
    entries_off, active_off, capacity = word(desc, 7), word(desc, 8), word(desc, 15)
    num_active, num_slots = tl.load(counts + word(desc, 9)), word(desc, 10)
    num_tiles = word(desc, 11)
    slot = tile // num_tiles
    n0 = (tile % num_tiles) * BN
    cols = n0 + tl.arange(0, BN)
    col_ok = cols < N
    one_wave = num_active * num_tiles <= PROGRAMS
    for a in range(slot, num_active, num_slots):
        expert = tl.load(I32 + active_off + a).to(tl.int64)
        lo = expert * capacity  # its entries' list
        hi = lo + tl.load(counts + expert)
        w_rows = W + w_off + expert * N * K + cols[:, None] * K
        if GEMV and one_wave and hi - lo == 1:
            entry = tl.load(I32 + entries_off + lo + tl.arange(0, 1)).to(tl.int64)
            y = expert_row(ACT + x_off + input_row(entry, top_k, GATED) * K, K, w_rows, col_ok, BN, BK, STAGES)
            y *= _norm_scale(desc, F32, entry // top_k, entry >= 0, K)[:, None]
            store_expert_rows(ACT, out_off, entry, entry >= 0, N, n0, y, GATED)
        elif PM > BM:
            if hi - lo > BM:
                expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, col_ok, PM, BN,
                            BK, DOT_F32, PM_STAGES, GATED)
            else:
                expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, col_ok, BM, BN,
                            BK, DOT_F32, STAGES, GATED)
        else:
            expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, col_ok, BM, BN, BK,
                        DOT_F32, STAGES, GATED)


@triton.jit
def claimed_blocks(desc, tile, W, ACT, F32, I32, counts, num_active, PM: tl.constexpr, TM: tl.constexpr,
                   BN: tl.constexpr, PN: tl.constexpr, BK: tl.constexpr, EP: tl.constexpr, DOT_F32: tl.constexpr,
                   STAGES: tl.constexpr, GATED: tl.constexpr):
    """A prefill's expert blocks of PM rows and PN columns (PN // BN of the group's BN-wide tiles), each claimed
    from its column block's counter (`claims_off`, zeroed every step) by whichever of the tasks on that block
    is free: the block u of a claim is, in the order of the active list, expert a's block u - start[a], start
    being the running sum of the blocks before it. (Each slot took every num_slots-th expert whole before, and
    the busiest took 24% longer than the mean: H200, Qwen3-30B-A3B, a 2,048-token prefill's gate/up. Claimed,
    TTFT 2048 85.6 -> 65.1 ms, 512 30.7 -> 22.6; but the decode steps, which never run this, 3-6% slower:
    benchmarks/RESULTS.md, session 40.) An expert's last block, where its rows fit in TM (< PM), takes [TM, PN]
    dots: a block's dots compute all of its rows, valid or not."""
    x_off, K, w_off, N, out_off = word8(desc, 0), word8(desc, 1), word8(desc, 2), word8(desc, 3), word8(desc, 4)
    top_k, capacity = word(desc, 5), word(desc, 15)
    WIDE: tl.constexpr = PN // BN
    column = tile % word(desc, 11)
    first = column - column % WIDE  # the column block's first tile
    n0 = first * BN
    cols = n0 + tl.arange(0, PN)
    w_cols = W + w_off + cols[:, None] * K
    a = tl.arange(0, EP)
    listed = a < num_active
    experts = tl.load(I32 + word(desc, 8) + a, mask=listed, other=0)
    rows = tl.load(counts + experts, mask=listed, other=0)
    blocks = (rows + PM - 1) // PM
    start = tl.cumsum(blocks, 0) - blocks
    claims = (F32 + word(desc, 16)).to(tl.pointer_type(tl.int32), bitcast=True) + first // WIDE
    total = tl.sum(blocks, 0)
    u = tl.atomic_add(claims, 1, sem="relaxed")
    while u < total:
        at = a == tl.sum((start + blocks <= u).to(tl.int32), 0)  # the active expert whose blocks hold u
        e = tl.sum(tl.where(at, experts, 0), 0).to(tl.int64)
        lo = e * capacity + (u - tl.sum(tl.where(at, start, 0), 0)) * PM
        hi = tl.minimum(lo + PM, e * capacity + tl.sum(tl.where(at, rows, 0), 0))
        w_rows = w_cols + e * N * K
        if TM < PM:
            if hi - lo <= TM:  # an expert's last rows, few enough for the shorter dots
                expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, cols < N, TM,
                            PN, BK, DOT_F32, STAGES, GATED)
            else:
                expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, cols < N, PM,
                            PN, BK, DOT_F32, STAGES, GATED)
        else:
            expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, cols < N, PM, PN,
                        BK, DOT_F32, STAGES, GATED)
        u = tl.atomic_add(claims, 1, sem="relaxed")


@triton.jit
def expert_dots(desc, F32, ACT, I32, lo, hi, x_off, top_k, K, N, out_off, w_rows, n0, col_ok, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
                GATED: tl.constexpr):
    """The entries lo .. hi of an expert's list (`append_pairs`) BM at a time: [BM, BN] tensor-core products over
    the K loop, each row scaled by its token's 1/rms where gate/up folds the norm in."""
    dt: tl.constexpr = w_rows.dtype.element_ty
    for m0 in range(lo, hi, BM):
        r = m0 + tl.arange(0, BM)
        r_ok = r < hi
        entry = tl.load(I32 + word(desc, 7) + r, mask=r_ok, other=0).to(tl.int64)
        x_rows = ACT + x_off + input_row(entry, top_k, GATED)[:, None] * K
        scale = _norm_scale(desc, F32, entry // top_k, r_ok, K)  # asked for before the loop, used after
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in tl.range(0, K, BK, num_stages=STAGES):
            ks = k0 + tl.arange(0, BK)
            k_ok = ks < K
            x = tl.load(x_rows + ks[None, :], mask=r_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if DOT_F32:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        acc *= scale[:, None]
        if BN > 64:
            # the claims' wide blocks a half of the rows at a time, their entries loaded again, as the
            # projections' 128-row epilogues (`row_halves`): every row's addresses at once spill
            top, bottom = row_halves(acc)
            half = m0 + tl.arange(0, BM // 2)
            store_expert_rows(ACT, out_off, tl.load(I32 + word(desc, 7) + half, mask=half < hi, other=0).to(tl.int64),
                              half < hi, N, n0, top, GATED)
            half += BM // 2
            store_expert_rows(ACT, out_off, tl.load(I32 + word(desc, 7) + half, mask=half < hi, other=0).to(tl.int64),
                              half < hi, N, n0, bottom, GATED)
        else:
            store_expert_rows(ACT, out_off, entry, r_ok, N, n0, acc, GATED)


@triton.jit
def store_expert_rows(ACT, out_off, entry, r_ok, N, n0, y, GATED: tl.constexpr):
    """Stores the fp32 products y ([rows, BN], weight rows n0 ..) of the entries' rows, rounded as HF's bf16 ops
    are: gate/up's as silu(gate) * up (columns alternate gate, up: output n0 / 2 + j from columns 2j, 2j + 1)."""
    dt: tl.constexpr = ACT.dtype.element_ty
    BR: tl.constexpr = y.shape[0]
    BN: tl.constexpr = y.shape[1]
    if GATED:
        gate, up = tl.split(tl.reshape(round_to(y, dt), (BR, BN // 2, 2)))
        h = round_to(round_to(gate / (1.0 + tl.exp(-gate)), dt) * up, dt)
        half = n0 // 2 + tl.arange(0, BN // 2)
        tl.store(ACT + out_off + entry[:, None] * (N // 2) + half[None, :], h.to(dt),
                 mask=r_ok[:, None] & (half < N // 2)[None, :])
    else:
        cols = n0 + tl.arange(0, BN)
        tl.store(ACT + out_off + entry[:, None] * N + cols[None, :], y.to(dt), mask=r_ok[:, None] & (cols < N)[None, :])


@triton.jit
def _norm_scale(desc, F32, tokens, ok, K):
    """1/rms of the tokens' rows where gate/up folds the layer's norm in, else 1."""
    return row_inv_rms(F32, word(desc, 13), tokens, ok, K, word_f32(desc, 14))


@triton.jit
def input_row(entry, top_k, GATED: tl.constexpr):
    """The input row of a (token, choice) entry: gate/up's is its token's hidden state, down's its own
    gate/up output."""
    if GATED:
        return entry // top_k
    else:
        return entry


@triton.jit
def expert_row(x_ptr, K, w_rows, col_ok, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """fp32 [1, BN]: the input row at x_ptr ([1] pointer) times the tile's BN weight rows, as the batch-1 GEMV
    does: a [BN, BK] accumulator reduced once."""
    acc = tl.zeros((BN, BK), tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr[:, None] + ks[None, :], mask=k_ok[None, :], other=0.0)  # [1, BK]
        acc += w.to(tl.float32) * x.to(tl.float32)
    return tl.sum(acc, 1)[None, :]


@triton.jit
def combine_task(desc, tile, ACT, F32, num_tokens, num_seqs, BM: tl.constexpr, BN: tl.constexpr, WM: tl.constexpr,
                 WN: tl.constexpr, TOPK: tl.constexpr, IN_DOWN: tl.constexpr):
    """out[t] = residual[t] + sum over slots j of weight[t, j] * y[t * top_k + j] (each product and the sum
    rounded, as HF; without a residual, the sum), and out's sums of squares when a norm reads it.

    A task a BN-column tile over every row, BM rows at a time, where that gives each task the most work; a
    prefill's rows in [WM, WN] blocks spread over the group's tasks instead (at 2,048 tokens a task's 128
    [16, 16] blocks took 190 us a layer, H200, Qwen3-30B-A3B: each load of y a 32-byte piece of a row).
    IN_DOWN (`moe_combine_in_down`): a step that only decodes is combined by down's tasks (`expert_task`); the
    host-driven baseline runs this group's tasks in such a step too, and they do nothing."""
    if IN_DOWN:
        if num_tokens > num_seqs:
            combine_columns(desc, tile, ACT, F32, num_tokens, BM, BN, WM, WN, TOPK)
    else:
        combine_columns(desc, tile, ACT, F32, num_tokens, BM, BN, WM, WN, TOPK)


@triton.jit
def combine_columns(desc, tile, ACT, F32, num_tokens, BM: tl.constexpr, BN: tl.constexpr, WM: tl.constexpr,
                    WN: tl.constexpr, TOPK: tl.constexpr):
    """`combine_task`'s blocks: a BN-column tile over every row, or the step's [WM, WN] blocks spread over the
    group's tasks."""
    hidden = word8(desc, 3)
    tasks = tl.cdiv(hidden, BN)
    wide_cols = tl.cdiv(hidden, WN)
    wide_units = tl.cdiv(num_tokens, WM) * wide_cols
    if wide_units >= tasks:
        for u in range(tile, wide_units, tasks):
            combine_block(desc, ACT, F32, num_tokens, (u // wide_cols) * WM, (u % wide_cols) * WN, WM, WN, TOPK)
    else:
        for m0 in range(0, num_tokens, BM):
            combine_block(desc, ACT, F32, num_tokens, m0, tile * BN, BM, BN, TOPK)


@triton.jit
def combine_block(desc, ACT, F32, num_tokens, m0, n0, BM: tl.constexpr, BN: tl.constexpr, TOPK: tl.constexpr):
    """Rows m0 .. m0 + BM and columns n0 .. n0 + BN of the combine (`combine_task`)."""
    y_off, weights_off, K = word8(desc, 0), word(desc, 1), word(desc, 2)
    hidden, out_off, res_off, out_stats_off = word8(desc, 3), word8(desc, 4), word(desc, 5), word(desc, 6)
    dt: tl.constexpr = ACT.dtype.element_ty
    cols = n0 + tl.arange(0, BN)
    col_ok = cols < hidden
    rows = m0 + tl.arange(0, BM)
    row_ok = rows < num_tokens
    mask = row_ok[:, None] & col_ok[None, :]
    out = tl.zeros((BM, BN), tl.float32)
    for j in tl.static_range(TOPK):
        if j < K:
            w = tl.load(ACT + weights_off + rows * K + j, mask=row_ok, other=0.0).to(tl.float32)
            y = tl.load(ACT + y_off + (rows * K + j)[:, None] * hidden + cols[None, :], mask=mask, other=0.0)
            out = round_to(out + round_to(y.to(tl.float32) * w[:, None], dt), dt)
    if res_off >= 0:
        res = tl.load(ACT + res_off + rows[:, None] * hidden + cols[None, :], mask=mask, other=0.0)
        out = round_to(res.to(tl.float32) + out, dt)
    store_rows(ACT, F32, out_off, hidden, rows, row_ok, cols, col_ok, out, out_stats_off, dt)
