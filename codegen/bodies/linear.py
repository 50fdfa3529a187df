"""Projection tiles: `fused_linear` and the LM head.

A task owns BN output columns. Its K loop is a plain product: an RMSNorm of the input is folded into the
placed weight (columns times the norm weight), leaving a row scale by 1/rms (from the producer's sum of
squares) to the epilogue, together with bias, SiLU-gating (a gate/up weight is placed with gate and up
rows interleaved, so every tile holds both halves of its outputs), residual add, store, and the sum of
squares of the stored rows when a norm reads the output.

Three shapes of the same computation, by the number of rows in the step:
- one row (batch-1 decode): a GEMV streaming [BN, BK] weight chunks into fp32 accumulators, and up to
  ROWS_GEMV rows the same chunks times each row in turn;
- a few rows (batched decode): one tensor-core dot over all rows and this task's columns, so the weights
  stream once whatever the batch. Up to BM rows, the task's BN columns; up to BMW rows, a block of columns,
  so that no task reads more input than weights: a block of BNBW columns whole where the group has a block
  of BNB for every program, else the task's split of a block of BNB columns' K range (the last split to
  finish sums the fp32 partials in order and runs the epilogue);
- many rows (prefill): the group's tasks share the [BMP, BNW] tiles of the whole output, so each weight
  and input chunk feeds a wide tensor-core tile instead of being read once per BN columns. When the tiles
  are too few for the group's tasks (a short prompt), their K ranges split over the tasks as above.
Every K loop loads unconditionally (masks only, no branches), so Triton's pipeliner keeps STAGES chunks of
weights and inputs in flight through shared memory.
"""
import triton
import triton.language as tl

from codegen.bodies.common import arrives_last, prefill_splits, round_to, row_halves, store_split, sum_of_splits
from codegen.bodies.common import EPILOGUE_TMA, GATED_TMA, INLINE_PTX, NARROW_ROWS, SHORT_PREFILL, SPLIT_SLICE_ROWS
from codegen.bodies.common import split_slices, sum_split_rows
from codegen.bodies.sync import bulk_stores_done
from codegen.bodies.common import add_norm_sums, norm_sums, word, word8, word_f32

LINEAR_FIELDS = ("x_off", "x_stride", "k", "w_off", "n", "out_off", "out_stride", "out_kind", "gated",
                 "stats_off", "eps", "res_off", "res_stride", "bias_off", "out_stats_off", "rows_kind", "splits",
                 "part_off", "ticket_off", "prefill_part_off", "prefill_ticket_off", "prefill_tasks", "route_rel",
                 "route_ticket")
# out_kind: activation rows 16-byte aligned (a width that is a multiple of 8), the fp32 logits, activation
# rows of another width (a router's logits over 6 or 60 experts)
OUT_ALIGNED, OUT_F32, OUT_NARROW = 0, 1, 2


@triton.jit
def row_inv_rms(F32, stats_off, rows, row_ok, K, eps):
    """1/rms of each row from the sum of squares its producer accumulated (1 where no norm applies)."""
    sumsq = tl.load(norm_sums(F32, stats_off) + rows, mask=row_ok & (stats_off >= 0), other=1.0).to(tl.float32)
    return tl.where(stats_off >= 0, tl.rsqrt(sumsq / K.to(tl.float32) + eps), 1.0)


@triton.jit
def store_outputs(desc, y, rows, row_ok, cols, col_ok, ACT, F32, r0=0, num_rows=0, c0=0, num_cols=0,
                  TMA: tl.constexpr = False):
    """Residual add, store and output statistics of a [rows, cols] block (y rounded to the model dtype). TMA:
    the block is rows r0 .. and columns c0 .. of outputs num_rows x num_cols (every column kept), and its
    residual and activation store go through tensor descriptors: a bulk copy each, where pointer tiles in the
    products' register layout moved 2 bytes a thread an instruction."""
    # The activations' rows are 16-byte aligned, but not said so here: with the residual's offset and the output's
    # stride hinted (`word8`) and a mask alike over 8 columns, these accesses take 16 bytes a thread, and the
    # conversions that feed them cost decode more than they save the prefill (H200: TTFT 512 -3 to -6%, b1 +1%,
    # b64 up to +3%; benchmarks/explore/NOTES.md, session 50)
    out_off, out_stride, out_kind = word8(desc, 5), word(desc, 6), word(desc, 7)
    res_off, res_stride, out_stats_off = word(desc, 11), word8(desc, 12), word(desc, 14)
    dt: tl.constexpr = ACT.dtype.element_ty
    i32: tl.constexpr = tl.int32
    BR: tl.constexpr = y.shape[0]
    BC: tl.constexpr = y.shape[1]
    mask = row_ok[:, None] & col_ok[None, :]
    if res_off >= 0:  # an activation
        if TMA:
            res = tl.make_tensor_descriptor(ACT + res_off, shape=[tl.cast(num_rows, i32),
                                            tl.cast(num_cols, i32)], strides=[res_stride, 1],
                                            block_shape=[BR, BC]).load([tl.cast(r0, i32), tl.cast(c0, i32)])
        else:
            res = tl.load(ACT + res_off + rows[:, None] * res_stride + cols[None, :], mask=mask, other=0.0)
        y = round_to(res.to(tl.float32) + y, dt)
    if out_kind == 1:  # OUT_F32
        tl.store(F32 + out_off + rows[:, None] * out_stride + cols[None, :], y, mask=mask)
    else:
        # one conversion above both stores (one in each branch broke Triton 3.6's layout pass on sm_90)
        out = y.to(dt)
        if out_kind == 0:  # OUT_ALIGNED: rows of a multiple of 8 elements
            if TMA:
                tl.make_tensor_descriptor(ACT + out_off, shape=[tl.cast(num_rows, i32), tl.cast(num_cols, i32)],
                                          strides=[out_stride, 1],
                                          block_shape=[BR, BC]).store([tl.cast(r0, i32), tl.cast(c0, i32)], out)
            else:
                tl.store(ACT + out_off + rows[:, None] * out_stride + cols[None, :], out, mask=mask)
        else:
            tl.store(ACT + out_off + rows[:, None] * out_stride + cols[None, :], out, mask=mask)
    if out_stats_off >= 0:
        add_norm_sums(F32, out_stats_off, rows, row_ok, y, mask)


@triton.jit
def linear_epilogue(desc, y, rows, row_ok, n0, W, ACT, F32, r0=0, num_rows=0, TMA: tl.constexpr = False,
                    GATING: tl.constexpr = 2):
    """Epilogue of the fp32 products y of rows x weight rows n0 .. n0 + y.shape[1]: 1/rms, bias, gating. TMA:
    rows are r0 .. of num_rows, the residual and store through tensor descriptors (`store_outputs`). GATING: 2,
    the descriptor says whether the columns are gated; 1 or 0, the caller knows (the other branch not compiled)."""
    kept_epilogue(desc, y, rows, row_ok, n0, tl.full((y.shape[1],), 1, tl.int32), W, ACT, F32, r0, num_rows, TMA,
                  GATING)


@triton.jit
def kept_epilogue(desc, y, rows, row_ok, n0, keep, W, ACT, F32, r0=0, num_rows=0, TMA: tl.constexpr = False,
                  GATING: tl.constexpr = 2):
    """`linear_epilogue` of the columns where `keep` (int32, one a column of y) is not 0 (every one with
    TMA)."""
    K, N = word8(desc, 2), word(desc, 4)
    gated = word(desc, 8) if GATING == 2 else GATING
    stats_off, eps, bias_off = word(desc, 9), word_f32(desc, 10), word(desc, 13)
    dt: tl.constexpr = W.dtype.element_ty
    BC: tl.constexpr = y.shape[1]
    cols = n0 + tl.arange(0, BC)
    col_ok = (cols < N) & (keep != 0)
    inv = row_inv_rms(F32, stats_off, rows, row_ok, K, eps)
    bias = tl.load(W + bias_off + cols, mask=col_ok & (bias_off >= 0), other=0.0).to(tl.float32)
    y = round_to(y * inv[:, None] + bias[None, :], dt)
    if gated == 1:  # columns alternate gate, up: output column n0 / 2 + j is silu(y[:, 2j]) * y[:, 2j + 1]
        gate, up = tl.split(tl.reshape(y, (y.shape[0], BC // 2, 2)))
        h = round_to(round_to(gate / (1.0 + tl.exp(-gate)), dt) * up, dt)
        half = n0 // 2 + tl.arange(0, BC // 2)
        keep_gate, _ = tl.split(tl.reshape(keep, (BC // 2, 2)))
        store_outputs(desc, h, rows, row_ok, half, (half < N // 2) & (keep_gate != 0), ACT, F32, r0, num_rows,
                      n0 // 2, N // 2, TMA)
    else:
        store_outputs(desc, y, rows, row_ok, cols, col_ok, ACT, F32, r0, num_rows, n0, N, TMA)


@triton.jit
def gemv_row(desc, tile, W, ACT, F32, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """Batch-1 decode: one input row times this task's BN weight rows."""
    x_off, K, w_off, N = word8(desc, 0), word8(desc, 2), word8(desc, 3), word(desc, 4)
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < N
    w_rows = W + w_off + cols[:, None].to(tl.int64) * K
    # An fp32 [BN, BK] accumulator reduced once is the fastest loop while it fits in 64 registers a thread;
    # beyond that it spills, and each chunk is reduced into [BN] instead.
    ACC2D: tl.constexpr = BN * BK <= 8192
    if ACC2D:
        acc = tl.zeros((BN, BK), tl.float32)
    else:
        acc = tl.zeros((BN,), tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(ACT + x_off + ks, mask=k_ok, other=0.0).to(tl.float32)
        if ACC2D:
            acc += w.to(tl.float32) * x[None, :]
        else:
            acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
    if ACC2D:
        y = tl.sum(acc, 1)
    else:
        y = acc
    row = tl.arange(0, 1)
    linear_epilogue(desc, y[None, :], row, row < 1, tile * BN, W, ACT, F32)


@triton.jit
def settle_tile(desc, j, part, parts, units, chunks, u0, u1, part_off, ticket_off, W, ACT, F32, BN: tl.constexpr):
    """`gemv_stream`'s tile j, if other parts hold units of it too: takes the tile's ticket (this part's partial
    is stored), and the last part to arrive sums every part's partial in part order and runs the epilogue."""
    if (j * chunks < u0) | ((j + 1) * chunks > u1):
        first = ((j * chunks + 1) * parts - 1) // units  # the parts that hold units of tile j
        last = ((j + 1) * chunks * parts - 1) // units
        if arrives_last(F32 + ticket_off + first, last - first + 1):
            tl.store(F32 + ticket_off + first, 0.0)  # for the next group that streams
            lanes = tl.arange(0, BN)
            total = tl.zeros((BN,), tl.float32)
            for q in range(first, last + 1):  # slot 0 holds a part's first tile, 1 its last
                total += tl.load(F32 + part_off + (q * 2 + (j != q * units // parts // chunks)) * BN + lanes)
            row = tl.arange(0, 1)
            linear_epilogue(desc, total[None, :], row, row < 1, j * BN, W, ACT, F32)


@triton.jit
def gemv_stream(desc, part, parts, W, ACT, F32, out_off, part_off, ticket_off, BN: tl.constexpr, BK: tl.constexpr,
                TM: tl.constexpr, STAGES: tl.constexpr, WHOLE: tl.constexpr = 0):
    """Batch-1 decode with the group's work shared out evenly: its (tile, K chunk) units, tile by tile, cut into
    `parts` ranges, one a program. A tile-a-task GEMV leaves programs idle in a group's last wave (gate/up's
    1,792 tasks are 6.8 waves of 264 programs) and drains its pipeline at every task's end; a range streams
    on from one tile into the next in one loop.
    Each tile's fp32 result goes to memory as it completes: a tile whole in the range to its columns of the F32
    region at `out_off`, whose epilogue then runs TM tiles at a time after the loop (one trip to memory for
    all of them); a tile shared with the neighbouring ranges to this part's slot at `part_off` (two [BN] slots
    a part: its first tile, its last), and the last part to arrive (a ticket counter the planner zeroes every
    step, at `ticket_off` + the tile's first part) sums them and runs the tile's epilogue. Every part has at
    least one unit (the lowering streams a group only if it has a unit for every program).
    WHOLE > 0: where the parts can take whole tiles, the largest streaming no more than WHOLE bytes past an even
    share, they do (`stream_range`): no tile is shared, so no part waits at a ticket or settles a tile."""
    x_off, K, w_off, N = word8(desc, 0), word8(desc, 2), word8(desc, 3), word(desc, 4)
    ACC2D: tl.constexpr = BN * BK <= 8192  # as in `gemv_row`
    # units and columns in int32, the weights' row offsets in the scalar base: a [BN, BK] tensor of int64
    # offsets costs ~60 registers a thread
    K32 = K.to(tl.int32)
    chunks = tl.cdiv(K32, BK)
    tiles = tl.cdiv(N.to(tl.int32), BN)
    units = tiles * chunks
    u0 = (part * units // parts).to(tl.int32)
    u1 = ((part + 1) * units // parts).to(tl.int32)
    if WHOLE > 0:
        # the bytes the parts of the most tiles stream past an even share, times parts
        unit_bytes: tl.constexpr = BN * BK * W.dtype.element_ty.primitive_bitwidth // 8
        past = (tl.cdiv(tiles, parts) * parts - tiles) * chunks * unit_bytes
        if (past <= WHOLE * parts) & (parts <= tiles):  # (every part has a tile)
            u0 = (part * tiles // parts * chunks).to(tl.int32)
            u1 = ((part + 1) * tiles // parts * chunks).to(tl.int32)
    j_first = u0 // chunks
    lanes = tl.arange(0, BN)
    ks = tl.arange(0, BK)
    if ACC2D:
        acc = tl.zeros((BN, BK), tl.float32)
    else:
        acc = tl.zeros((BN,), tl.float32)
    # one loop (a loop of rounds around it took ~50 more registers a thread, results held in registers
    # through it ~70 more, and an epilogue inside it stopped Triton pipelining it)
    for u in tl.range(u0, u1, num_stages=STAGES):
        j = u // chunks
        k0 = (u - j * chunks) * BK
        k_ok = ks < K32 - k0
        w = tl.load(W + (w_off + j.to(tl.int64) * BN * K + k0) + lanes[:, None] * K32 + ks[None, :],
                    mask=(j * BN + lanes < N)[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(ACT + x_off + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)
        if ACC2D:
            acc += w.to(tl.float32) * x[None, :]
        else:
            acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
        if (u - j * chunks == chunks - 1) | (u == u1 - 1):  # the tile's last chunk in this range
            if ACC2D:
                y = tl.sum(acc, 1)
            else:
                y = acc
            whole = (j * chunks >= u0) & ((j + 1) * chunks <= u1)
            tl.store(F32 + tl.where(whole, out_off + j * BN, part_off + (part * 2 + (j != j_first)) * BN) + lanes, y)
            # the next tile starts from zero: computed here, since zeros assigned in a branch compile to a
            # choice before it, which keeps a second accumulator live through the reduction
            acc = acc * 0.0
    tl.debug_barrier()  # every thread's results stored
    j_last = (u1 - 1) // chunks
    settle_tile(desc, j_first, part, parts, units, chunks, u0, u1, part_off, ticket_off, W, ACT, F32, BN)
    if j_last != j_first:
        settle_tile(desc, j_last, part, parts, units, chunks, u0, u1, part_off, ticket_off, W, ACT, F32, BN)
    row = tl.arange(0, 1)
    for c0 in range(j_first * BN, (j_last + 1) * BN, TM * BN):  # the whole tiles, TM at a time
        cols = c0 + tl.arange(0, TM * BN)
        firsts = cols // BN * chunks
        whole = (firsts >= u0) & (firsts + chunks <= u1)
        y = tl.load(F32 + out_off + cols, mask=whole, other=0.0)
        kept_epilogue(desc, y[None, :], row, row < 1, c0, whole.to(tl.int32), W, ACT, F32)


@triton.jit
def gemv_rows(desc, tile, num_rows, W, ACT, F32, R: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              STAGES: tl.constexpr):
    """A few rows (up to R): the GEMV's chunks of this task's BN weight rows, each times every input row in
    turn, so that as many bytes of weights are in flight as at batch 1."""
    x_off, x_stride, K, w_off, N = word8(desc, 0), word8(desc, 1), word8(desc, 2), word8(desc, 3), word(desc, 4)
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < N
    w_rows = W + w_off + cols[:, None].to(tl.int64) * K
    rows = tl.arange(0, R)
    row_ok = rows < num_rows
    acc = tl.zeros((R, BN), tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        for r in tl.static_range(R):
            x = tl.load(ACT + x_off + r * x_stride + ks, mask=k_ok & (r < num_rows), other=0.0).to(tl.float32)
            acc += tl.where(rows[:, None] == r, tl.sum(w * x[None, :], 1)[None, :], 0.0)
    linear_epilogue(desc, acc, rows, row_ok, tile * BN, W, ACT, F32)


@triton.jit
def dot_product(desc, m0, n0, k_lo, k_hi, num_rows, W, ACT, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr = False,
                EVEN_K: tl.constexpr = False, EVEN_N: tl.constexpr = False):
    """`tile_product` of a projection's input and weight (its descriptor's words)."""
    return tile_product(word8(desc, 0), word8(desc, 1), word8(desc, 2), word8(desc, 3), word(desc, 4), m0, n0,
                        k_lo, k_hi, num_rows, W, ACT, BM, BN, BK, DOT_F32, STAGES, TMA, EVEN_K, EVEN_N)


@triton.jit
def tile_product(x_off, x_stride, K, w_off, N, m0, n0, k_lo, k_hi, num_rows, W, ACT, BM: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr,
                 EVEN_K: tl.constexpr = False, EVEN_N: tl.constexpr = False):
    """fp32 [BM, BN] product of input rows m0 .. m0 + BM (of num_rows, x_stride apart) and weight rows
    n0 .. n0 + BN (of N, K apart) over input columns k_lo .. k_hi, on tensor cores. TMA: the chunks come
    through tensor descriptors made here (Hopper's bulk tensor copies: one instruction a chunk instead of a
    thread's per 16 bytes, and no masks, since rows and columns past the ends read as zeros) instead of
    masked pointer tiles. EVEN_K: k_lo and k_hi are multiples of BK (`codegen.lower.even_chunks`), so the
    pointer tiles' K loop takes no K mask; with EVEN_N too (N a multiple of BN, `codegen.lower.even_columns`),
    their weight rows take no mask at all, and only the input rows theirs."""
    if TMA:
        i32: tl.constexpr = tl.int32  # descriptors take 32-bit shapes and coordinates
        end = tl.cast(k_hi, i32)
        xs = tl.make_tensor_descriptor(ACT + x_off, shape=[tl.cast(num_rows, i32), end], strides=[x_stride, 1],
                                       block_shape=[BM, BK])
        ws = tl.make_tensor_descriptor(W + w_off, shape=[tl.cast(N, i32), end], strides=[K, 1],
                                       block_shape=[BN, BK])
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in tl.range(tl.cast(k_lo, i32), end, BK, num_stages=STAGES):
            x, w = xs.load([tl.cast(m0, i32), k0]), ws.load([tl.cast(n0, i32), k0])
            if DOT_F32:
                acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        return acc
    cols = n0 + tl.arange(0, BN)
    col_ok = cols < N
    rows = m0 + tl.arange(0, BM)
    row_ok = rows < num_rows
    x_rows = ACT + x_off + rows[:, None].to(tl.int64) * x_stride
    w_rows = W + w_off + cols[:, None].to(tl.int64) * K
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        # with every chunk whole, masks the same from one chunk to the next: ~10% fewer instructions a chunk
        # in the batched blocks' loop, which its instructions bound (H200: b64 -0.8%, b32 -1.6%)
        k_ok = (ks < k_hi) | EVEN_K
        if EVEN_K and EVEN_N:
            # a mask costs a copy three instructions (its predicate rebuilt from packed bits): the weights'
            # were 40 of gate/up's 178 a chunk at b64
            w = tl.load(w_rows + ks[None, :])
        else:
            w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    return acc


@triton.jit
def dot_block(desc, m0, n0, num_rows, W, ACT, F32, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              DOT_F32: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr = False, EVEN_K: tl.constexpr = False,
              EVEN_N: tl.constexpr = False, EPI_TMA: tl.constexpr = False):
    """Rows m0 .. m0 + BM times weight rows n0 .. n0 + BN over all of K, with the epilogue: a tile of more than 64
    rows a half at a time (`row_halves`), but gate/up's whole with GATED_TMA. EPI_TMA: the epilogue may store
    through tensor descriptors (every tile's with EPILOGUE_TMA, else gate/up's with GATED_TMA), and the caller
    waits for those stores (`bulk_stores_done`)."""
    acc = dot_product(desc, m0, n0, 0, word8(desc, 2), num_rows, W, ACT, BM, BN, BK, DOT_F32, STAGES, TMA, EVEN_K,
                      EVEN_N)
    if (BM > 64) and GATED_TMA:
        if word(desc, 8) == 1:  # gate/up: gated before any address is made (half the columns), all rows at once
            rows = m0 + tl.arange(0, BM)
            linear_epilogue(desc, acc, rows, rows < num_rows, n0, W, ACT, F32, m0, num_rows, EPI_TMA, 1)
        else:
            halves_epilogue(desc, acc, m0, num_rows, n0, W, ACT, F32, EPI_TMA and EPILOGUE_TMA, 0)
    elif BM > 64:
        halves_epilogue(desc, acc, m0, num_rows, n0, W, ACT, F32, EPI_TMA)
    else:
        rows = m0 + tl.arange(0, BM)
        linear_epilogue(desc, acc, rows, rows < num_rows, n0, W, ACT, F32, m0, num_rows, EPI_TMA)


@triton.jit
def halves_epilogue(desc, acc, m0, num_rows, n0, W, ACT, F32, TMA: tl.constexpr, GATING: tl.constexpr = 2):
    """`linear_epilogue` of rows m0 .. of a tile of more than 64 rows, a half at a time (`row_halves`)."""
    HALF: tl.constexpr = acc.shape[0] // 2
    top, bottom = row_halves(acc)
    rows = m0 + tl.arange(0, HALF)
    linear_epilogue(desc, top, rows, rows < num_rows, n0, W, ACT, F32, m0, num_rows, TMA, GATING)
    rows += HALF
    linear_epilogue(desc, bottom, rows, rows < num_rows, n0, W, ACT, F32, m0 + HALF, num_rows, TMA, GATING)


@triton.jit
def split_block(desc, tile, num_tasks, num_rows, W, ACT, F32, I32, BM: tl.constexpr, BN: tl.constexpr,
                BNW: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr,
                EVEN_K: tl.constexpr, EVEN_N: tl.constexpr = False):
    """Up to BM rows times blocks of columns. With `splits` > 1 the task is split `tile % splits` of the K
    range of block `tile // splits` of BN columns (the group's tasks past its blocks' splits have none), and
    the last split to finish (a ticket counter the planner zeroes every step) sums the fp32 partials in order
    and runs the epilogue, or, in blocks of more than SPLIT_SLICE_ROWS rows, the splits do so a slice of rows at
    a time (`split_slices`); with one, task `tile` of the group's `num_tasks` owns blocks `tile`,
    `tile + num_tasks`... of BNW columns whole (where blocks are at least as wide as a task's columns, one
    block or none: the group's other tasks are idle)."""
    K, N = word8(desc, 2), word(desc, 4)
    splits, part_off, ticket_off = word(desc, 16), word(desc, 17), word(desc, 18)
    rows = tl.arange(0, BM)
    row_ok = rows < num_rows
    if splits == 1:
        for block in range(tile, tl.cdiv(N, BNW), num_tasks):
            dot_block(desc, 0, block * BNW, num_rows, W, ACT, F32, BM, BNW, BK, DOT_F32, STAGES, TMA, EVEN_K, EVEN_N)
    else:
        block = tile // splits
        split = tile % splits
        if block < tl.cdiv(N, BN):  # (with fewer splits than a block's tasks, the group's last tasks have none)
            chunk = tl.cdiv(tl.cdiv(K, splits), BK) * BK
            k_lo = split * chunk
            k_hi = tl.multiple_of(tl.minimum(K, k_lo + chunk), 8)  # both are: keeps the K mask vector-wide
            acc = dot_product(desc, 0, block * BN, k_lo, k_hi, num_rows, W, ACT, BM, BN, BK, DOT_F32, STAGES, TMA,
                              EVEN_K, EVEN_N)
            if (SPLIT_SLICE_ROWS > 0) and (BM > SPLIT_SLICE_ROWS):  # the splits finish the block a slice each
                base, first, step = split_slices(F32, I32, part_off, ticket_off, block, split, splits, acc, num_rows,
                                                 SPLIT_SLICE_ROWS)
                for q in range(first, tl.cdiv(num_rows, SPLIT_SLICE_ROWS), step):
                    r = q * SPLIT_SLICE_ROWS + tl.arange(0, SPLIT_SLICE_ROWS)
                    total = sum_split_rows(F32, base, splits, q * SPLIT_SLICE_ROWS, BM, BN, SPLIT_SLICE_ROWS)
                    linear_epilogue(desc, total, r, r < num_rows, block * BN, W, ACT, F32)
            else:
                last, total = sum_of_splits(F32, part_off, ticket_off, block, split, splits, acc, rows, BM)
                if last:
                    linear_epilogue(desc, total, rows, row_ok, block * BN, W, ACT, F32)


@triton.jit
def batched_block(desc, tile, num_tasks, num_rows, W, ACT, F32, I32, BMW: tl.constexpr, BN: tl.constexpr,
                  BNW: tl.constexpr, BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr,
                  EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """`split_block` over BMW rows, or over NARROW_ROWS where the step has no more (`narrow_batch_rows`: a kernel
    for many sequences running a few pays for the padding rows' inputs and dots only where it has them)."""
    if (NARROW_ROWS > 0) and (NARROW_ROWS < BMW):
        if num_rows <= NARROW_ROWS:
            split_block(desc, tile, num_tasks, num_rows, W, ACT, F32, I32, NARROW_ROWS, BN, BNW, BK, DOT_F32, STAGES,
                        TMA, EVEN_K, EVEN_N)
        else:
            split_block(desc, tile, num_tasks, num_rows, W, ACT, F32, I32, BMW, BN, BNW, BK, DOT_F32, STAGES, TMA,
                        EVEN_K, EVEN_N)
    else:
        split_block(desc, tile, num_tasks, num_rows, W, ACT, F32, I32, BMW, BN, BNW, BK, DOT_F32, STAGES, TMA, EVEN_K,
                    EVEN_N)


@triton.jit
def linear_rows(desc, tile, parts, num_rows, W, ACT, F32, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                BKM: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, ROWS_GEMV: tl.constexpr,
                ROWS_STAGES: tl.constexpr, ROWS_MAX: tl.constexpr, STREAM_OUT: tl.constexpr,
                STREAM_PARTS: tl.constexpr, STREAM_TICKETS: tl.constexpr, STREAM_BK: tl.constexpr,
                STREAM_STAGES: tl.constexpr, STREAM_TILES: tl.constexpr, STREAM_WHOLE: tl.constexpr,
                EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Up to ROWS_MAX rows (at most BM): the GEMV, the few-row GEMV or the 16-row dots (none of them wgmma, so
    `outline` can make this a function of its own; the dots are compiled in only where ROWS_MAX is more rows
    than the few-row GEMV takes). `parts` > 0: the task is part `tile` of the group's streamed GEMV."""
    if num_rows == 1:
        if STREAM_BK > 0:  # compiled in only where some group streams: its registers cost the other bodies
            if parts > 0:
                gemv_stream(desc, tile, parts, W, ACT, F32, STREAM_OUT, STREAM_PARTS, STREAM_TICKETS, BN, STREAM_BK,
                            STREAM_TILES, STREAM_STAGES, STREAM_WHOLE)
            else:
                gemv_row(desc, tile, W, ACT, F32, BN, BK, STAGES)
        else:
            gemv_row(desc, tile, W, ACT, F32, BN, BK, STAGES)
    elif num_rows <= ROWS_GEMV:
        if ROWS_GEMV > 1:
            gemv_rows(desc, tile, num_rows, W, ACT, F32, ROWS_GEMV, BN, BK, STAGES)
    elif (ROWS_MAX > ROWS_GEMV) and (ROWS_MAX > 1):
        dot_block(desc, 0, tile * BN, num_rows, W, ACT, F32, BM, BN, BKM, DOT_F32, ROWS_STAGES, False, EVEN_K,
                  EVEN_N)


@triton.jit
def linear_task(desc, tile, parts, W, ACT, F32, I32, num_tokens, num_seqs, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, BKM: tl.constexpr, BMW: tl.constexpr, BMP: tl.constexpr, BNW: tl.constexpr,
                BNB: tl.constexpr, BNBW: tl.constexpr, BKD: tl.constexpr, DOT_F32: tl.constexpr,
                STAGES: tl.constexpr, BATCH_STAGES: tl.constexpr, PREFILL_STAGES: tl.constexpr, BATCH_TMA: tl.constexpr,
                PREFILL_TMA: tl.constexpr, PREFILL_PARTS: tl.constexpr, PREFILL_SPLITS: tl.constexpr,
                ROWS_GEMV: tl.constexpr, ROWS_STAGES: tl.constexpr, ROWS_MAX: tl.constexpr, PREFILL_BK: tl.constexpr,
                STREAM_OUT: tl.constexpr, STREAM_PARTS: tl.constexpr, STREAM_TICKETS: tl.constexpr,
                STREAM_BK: tl.constexpr, STREAM_STAGES: tl.constexpr, STREAM_TILES: tl.constexpr,
                STREAM_WHOLE: tl.constexpr, CLAIMED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                PREFILL_ONLY: tl.constexpr):
    """BK, BKM, BKD, PREFILL_BK: the K chunk of the GEMV, of the dots over up to BM rows, of the [BMW, BNB]
    batched blocks (BNBW columns where they run whole), of the [BMP, BNW] prefill tiles; STAGES, BATCH_STAGES,
    PREFILL_STAGES: their pipelining depths;
    BATCH_TMA, PREFILL_TMA: the batched blocks, the prefill tiles load through tensor descriptors;
    PREFILL_PARTS, PREFILL_SPLITS: the prefill tiles' split-K scratch in parts, and its splits (0: auto);
    ROWS_GEMV: steps of up to this many rows take `gemv_rows` (0: none); ROWS_STAGES: the few-row dots' depth;
    ROWS_MAX (at most BM): steps of up to this many rows take `linear_rows`, more the batched blocks;
    `parts` > 0 (a one-row step of a group that streams): the task is part `tile` of `gemv_stream`, whose
    results, partials and tickets are the F32 regions at STREAM_OUT, STREAM_PARTS and STREAM_TICKETS, whose K
    chunk is STREAM_BK (0: no group streams), pipelined STREAM_STAGES deep, whose epilogue takes STREAM_TILES
    tiles at a time, and whose parts take whole tiles where that costs no more than STREAM_WHOLE bytes;
    CLAIMED: one in this many rounds of a prefill step's tiles (a tile a program) is claimed; a prefill step of at
    most SHORT_PREFILL tokens takes 64-row tiles where BMP is more (`short_prefill_tokens`);
    EVEN_K, EVEN_N: every K chunk, every column tile of the pointer tiles is whole (`tile_product`);
    PREFILL_ONLY: some projection has tasks past its column tiles that only prefill steps give work
    (`codegen.lower._prefill_tasks`)."""
    num_rows = tl.where(word(desc, 15) == 1, num_seqs, num_tokens)
    # (steps that do not prefill have a task a column tile, `prefill_tasks` past them idle: each branch reads the
    # count where it used to, so that a kernel without such tasks compiles as before they existed)
    if num_rows <= ROWS_MAX:
        if PREFILL_ONLY:
            if tile < tl.cdiv(word(desc, 4), BN):
                linear_rows(desc, tile, parts, num_rows, W, ACT, F32, BM, BN, BK, BKM, DOT_F32, STAGES, ROWS_GEMV,
                            ROWS_STAGES, ROWS_MAX, STREAM_OUT, STREAM_PARTS, STREAM_TICKETS, STREAM_BK,
                            STREAM_STAGES, STREAM_TILES, STREAM_WHOLE, EVEN_K, EVEN_N)
        else:
            linear_rows(desc, tile, parts, num_rows, W, ACT, F32, BM, BN, BK, BKM, DOT_F32, STAGES, ROWS_GEMV,
                        ROWS_STAGES, ROWS_MAX, STREAM_OUT, STREAM_PARTS, STREAM_TICKETS, STREAM_BK, STREAM_STAGES,
                        STREAM_TILES, STREAM_WHOLE, EVEN_K, EVEN_N)
    elif num_rows <= BMW:  # batched decode: BNB (or BNBW) columns a dot, so that inputs are read no more than weights
        if PREFILL_ONLY:
            if tile < tl.cdiv(word(desc, 4), BN):
                batched_block(desc, tile, tl.cdiv(word(desc, 4), BN), num_rows, W, ACT, F32, I32, BMW, BNB, BNBW,
                              BKD, DOT_F32, BATCH_STAGES, BATCH_TMA, EVEN_K, EVEN_N)
        else:
            batched_block(desc, tile, tl.cdiv(word(desc, 4), BN), num_rows, W, ACT, F32, I32, BMW, BNB, BNBW, BKD,
                          DOT_F32, BATCH_STAGES, BATCH_TMA, EVEN_K, EVEN_N)
    elif (SHORT_PREFILL > 0) and (BMP > 64):  # prefill, on 64-row tiles where the step is short
        if num_rows <= SHORT_PREFILL:
            prefill_tiles(desc, tile, num_rows, W, ACT, F32, I32, BN, 64, BNW, DOT_F32, PREFILL_STAGES, PREFILL_TMA,
                          PREFILL_PARTS, PREFILL_SPLITS, PREFILL_BK, CLAIMED, EVEN_K, EVEN_N, PREFILL_ONLY)
        else:
            prefill_tiles(desc, tile, num_rows, W, ACT, F32, I32, BN, BMP, BNW, DOT_F32, PREFILL_STAGES, PREFILL_TMA,
                          PREFILL_PARTS, PREFILL_SPLITS, PREFILL_BK, CLAIMED, EVEN_K, EVEN_N, PREFILL_ONLY)
    else:  # prefill
        prefill_tiles(desc, tile, num_rows, W, ACT, F32, I32, BN, BMP, BNW, DOT_F32, PREFILL_STAGES, PREFILL_TMA,
                      PREFILL_PARTS, PREFILL_SPLITS, PREFILL_BK, CLAIMED, EVEN_K, EVEN_N, PREFILL_ONLY)


@triton.jit
def prefill_tiles(desc, tile, num_rows, W, ACT, F32, I32, BN: tl.constexpr, BMP: tl.constexpr, BNW: tl.constexpr,
                  DOT_F32: tl.constexpr, PREFILL_STAGES: tl.constexpr, PREFILL_TMA: tl.constexpr,
                  PREFILL_PARTS: tl.constexpr, PREFILL_SPLITS: tl.constexpr, PREFILL_BK: tl.constexpr,
                  CLAIMED: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PREFILL_ONLY: tl.constexpr):
    """A prefill step's task `tile` of a projection: its share of the [BMP, BNW] tiles, row blocks innermost (the
    programs running at once share weights in L2), or of their K splits where the tiles are too few
    (`linear_task` names the constexprs)."""
    K, N, part_off, ticket_off = word8(desc, 2), word(desc, 4), word(desc, 19), word(desc, 20)
    row_blocks = tl.cdiv(num_rows, BMP)
    tiles = row_blocks * tl.cdiv(N, BNW)
    # The group's first P tasks (a program each, not claimed) take every P-th tile (or K split) of all but
    # the last of its rounds of P, one in CLAIMED rounds down; each later task, claimed by whichever program
    # is free first, one of the rest. A task a tile is costly (its fetch, wait and signal: gate/up's 1,792
    # tiles at 512 tokens as a claimed task each, TTFT 19.76 ms against 18.50 a program's share), and claimed
    # tiles balance the tail (codegen.config, `prefill_claimed_part`).
    if PREFILL_ONLY:
        tasks = word(desc, 21)  # the group's: a narrow projection has tasks past its column tiles
    else:
        tasks = tl.cdiv(N, BN)
    P = tl.minimum(tasks, tl.num_programs(0))
    splits = prefill_splits(tiles, P, K, PREFILL_PARTS, ticket_off, PREFILL_SPLITS, PREFILL_BK)
    items = tiles * splits
    rounds = tl.cdiv(items, P)
    static = tl.where(tasks > P, tl.minimum(tl.maximum(rounds - rounds // CLAIMED, 1) * P, items), items)
    first = tile < P
    start = tl.where(first, tile, static + tile - P)
    stop = tl.where(first, static, items)
    step = tl.where(first, P, tl.maximum(tasks - P, 1))
    if splits == 1 and PREFILL_TMA and (EPILOGUE_TMA or (GATED_TMA and BMP > 64)):
        # a while loop, not a for: Triton hoists a descriptor store's staging buffer out of an enclosing for
        # loop, where it cannot share the K loop's pipeline buffers' shared memory (+24 KB a program: one
        # program an SM at 2,048 tokens)
        item = start
        while item < stop:
            dot_block(desc, (item % row_blocks) * BMP, (item // row_blocks) * BNW, num_rows, W, ACT, F32,
                      BMP, BNW, PREFILL_BK, DOT_F32, PREFILL_STAGES, True, EVEN_K, EVEN_N, True)
            item += step
        if INLINE_PTX:  # the tiles' bulk stores written before the task signals
            bulk_stores_done(tile)
    elif splits == 1:
        for item in range(start, stop, step):
            dot_block(desc, (item % row_blocks) * BMP, (item // row_blocks) * BNW, num_rows, W, ACT, F32,
                      BMP, BNW, PREFILL_BK, DOT_F32, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_N)
    else:  # ... or (tile, K split) items, splits of a tile side by side
        chunk = tl.cdiv(tl.cdiv(K, splits), PREFILL_BK) * PREFILL_BK
        for item in range(start, stop, step):
            m0 = (item % row_blocks) * BMP
            split = item // row_blocks % splits
            n0 = item // (row_blocks * splits) * BNW
            k_lo = split * chunk
            k_hi = tl.multiple_of(tl.minimum(K, k_lo + chunk), 8)  # both are: keeps the K mask vector-wide
            acc = dot_product(desc, m0, n0, k_lo, k_hi, num_rows, W, ACT, BMP, BNW, PREFILL_BK, DOT_F32,
                              PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_N)
            last, base = store_split(F32, part_off, ticket_off, n0 // BNW * row_blocks + m0 // BMP, split,
                                     splits, acc)
            if last:  # the epilogue 16 rows at a time, up to the step's last row
                for r0 in range(0, tl.minimum(BMP, num_rows - m0), 16):
                    rows = m0 + r0 + tl.arange(0, 16)
                    linear_epilogue(desc, sum_split_rows(F32, base, splits, r0, BMP, BNW, 16), rows,
                                    rows < num_rows, n0, W, ACT, F32)
