"""Projection tiles: `fused_linear` and the LM head.

A task owns BN output columns. Its body: the prologue on each input chunk (RMSNorm from the producer's
sum of squares, or SiLU-gating), the products, then bias, residual add, store, and the sum of squares of
the stored rows when a norm reads the output.

Three shapes of the same computation, by the number of rows in the step:
- one row (batch-1 decode): a GEMV streaming [BN, BK] weight chunks into fp32 accumulators;
- a few rows (batched decode): tensor-core dots over BM-row blocks of this task's BN columns;
- many rows (prefill): the group's tasks share the [BMW, BNW] tiles of the whole output, so each weight
  and input chunk feeds a wide tensor-core tile instead of being read once per BN columns.
Every K loop loads unconditionally (masks only, no branches), so Triton's pipeliner keeps STAGES chunks of
weights and inputs in flight through shared memory; each body is compiled once per prologue.
"""
import triton
import triton.language as tl

from codegen.bodies.common import round_to, word, word8, word_f32

LINEAR_FIELDS = ("x_off", "x_stride", "k", "w_off", "n", "out_off", "out_stride", "out_f32", "prologue",
                 "stats_off", "norm_w_off", "eps", "res_off", "res_stride", "bias_off", "out_stats_off",
                 "rows_kind")
PROLOGUE_CODES = {"none": 0, "rms_norm": 1, "silu_mul": 2}


@triton.jit
def apply_prologue(x, aux, inv, PROLOGUE: tl.constexpr, dt: tl.constexpr):
    """The input chunk after the prologue, in fp32 rounded to the model dtype. `aux` is the RMSNorm weight
    (prologue 1) or the up half of the gate/up output (prologue 2); `inv` the rows' 1/rms. The code is a
    compile-time constant: callers branch once outside their K loop, never inside it (a load under a
    branch is not pipelined) and never compute both forms (the prologue is most of a GEMV loop's work)."""
    if PROLOGUE == 1:
        x = round_to(round_to(x * inv, dt) * aux, dt)
    elif PROLOGUE == 2:
        x = round_to(round_to(x / (1.0 + tl.exp(-x)), dt) * aux, dt)
    return x


@triton.jit
def row_inv_rms(F32, stats_off, rows, row_ok, K, eps, prologue):
    """1/rms of each row from the sum of squares its producer accumulated (1 where no norm applies)."""
    sumsq = tl.load(F32 + stats_off + rows, mask=row_ok & (prologue == 1), other=1.0)
    return tl.where(prologue == 1, tl.rsqrt(sumsq / K.to(tl.float32) + eps), 1.0)


@triton.jit
def aux_pointer(W, ACT, x_off, K, norm_w_off, prologue):
    """Where the prologue's second operand lives: the norm weight (one row) or the up half (row stride)."""
    return tl.where(prologue == 2, ACT + x_off + K, W + norm_w_off)


@triton.jit
def linear_epilogue(desc, y, rows, row_ok, cols, col_ok, W, ACT, F32):
    """Epilogue of a [rows, cols] block of fp32 products: bias, residual, store, output statistics."""
    out_off, out_stride, out_f32 = word8(desc, 5), word(desc, 6), word(desc, 7)
    res_off, res_stride, bias_off, out_stats_off = word(desc, 12), word8(desc, 13), word(desc, 14), word(desc, 15)
    dt: tl.constexpr = W.dtype.element_ty
    bias = tl.load(W + bias_off + cols, mask=col_ok & (bias_off >= 0), other=0.0).to(tl.float32)
    y = round_to(y + bias[None, :], dt)
    mask = row_ok[:, None] & col_ok[None, :]
    if res_off >= 0:
        res = tl.load(ACT + res_off + rows[:, None] * res_stride + cols[None, :], mask=mask, other=0.0)
        y = round_to(res.to(tl.float32) + y, dt)
    if out_f32 == 1:
        tl.store(F32 + out_off + rows[:, None] * out_stride + cols[None, :], y, mask=mask)
    else:
        tl.store(ACT + out_off + rows[:, None] * out_stride + cols[None, :], y.to(dt), mask=mask)
    if out_stats_off >= 0:
        tl.atomic_add(F32 + out_stats_off + rows, tl.sum(tl.where(mask, y * y, 0.0), 1), mask=row_ok)


@triton.jit
def gemv_row(desc, tile, W, ACT, F32, PROLOGUE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             STAGES: tl.constexpr):
    """Batch-1 decode: one input row times this task's BN weight rows."""
    x_off, K, w_off, N = word8(desc, 0), word8(desc, 2), word8(desc, 3), word(desc, 4)
    stats_off, norm_w_off, eps = word(desc, 9), word8(desc, 10), word_f32(desc, 11)
    dt: tl.constexpr = W.dtype.element_ty
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < N
    row = tl.arange(0, 1)
    inv = row_inv_rms(F32, stats_off, row, row < 1, K, eps, PROLOGUE)
    aux_ptr = aux_pointer(W, ACT, x_off, K, norm_w_off, PROLOGUE)
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
        aux = tl.load(aux_ptr + ks, mask=k_ok & (PROLOGUE != 0), other=0.0).to(tl.float32)
        x = apply_prologue(x[None, :], aux[None, :], inv[:, None], PROLOGUE, dt)
        if ACC2D:
            acc += w.to(tl.float32) * x
        else:
            acc += tl.sum(w.to(tl.float32) * x, 1)
    if ACC2D:
        y = tl.sum(acc, 1)
    else:
        y = acc
    linear_epilogue(desc, y[None, :], row, row < 1, cols, col_ok, W, ACT, F32)


@triton.jit
def dot_block(desc, m0, n0, num_rows, W, ACT, F32, PROLOGUE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr):
    """Rows m0 .. m0 + BM times weight rows n0 .. n0 + BN on tensor cores, with the epilogue."""
    x_off, x_stride, K = word8(desc, 0), word8(desc, 1), word8(desc, 2)
    w_off, N, stats_off = word8(desc, 3), word(desc, 4), word(desc, 9)
    norm_w_off, eps = word8(desc, 10), word_f32(desc, 11)
    dt: tl.constexpr = W.dtype.element_ty
    cols = n0 + tl.arange(0, BN)
    col_ok = cols < N
    rows = m0 + tl.arange(0, BM)
    row_ok = rows < num_rows
    inv = row_inv_rms(F32, stats_off, rows, row_ok, K, eps, PROLOGUE)
    x_rows = ACT + x_off + rows[:, None].to(tl.int64) * x_stride
    # the norm weight is one row (stride 0); the up half has the input's row stride
    aux_rows = aux_pointer(W, ACT, x_off, K, norm_w_off, PROLOGUE) + tl.where(
        PROLOGUE == 2, rows[:, None].to(tl.int64) * x_stride, 0)
    w_rows = W + w_off + cols[:, None].to(tl.int64) * K
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        x_mask = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_rows + ks[None, :], mask=x_mask, other=0.0).to(tl.float32)
        aux = tl.load(aux_rows + ks[None, :], mask=x_mask & (PROLOGUE != 0), other=0.0).to(tl.float32)
        x = apply_prologue(x, aux, inv[:, None], PROLOGUE, dt)
        if DOT_F32:
            acc += tl.dot(x, tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x.to(dt), tl.trans(w))
    linear_epilogue(desc, acc, rows, row_ok, cols, col_ok, W, ACT, F32)


@triton.jit
def linear_rows(desc, tile, num_rows, W, ACT, F32, PROLOGUE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, BKM: tl.constexpr, BMW: tl.constexpr, BNW: tl.constexpr, BKD: tl.constexpr,
                DOT_F32: tl.constexpr, STAGES: tl.constexpr):
    if num_rows == 1:
        gemv_row(desc, tile, W, ACT, F32, PROLOGUE, BN, BK, STAGES)
    elif num_rows <= BMW:
        for m0 in range(0, num_rows, BM):
            dot_block(desc, m0, tile * BN, num_rows, W, ACT, F32, PROLOGUE, BM, BN, BKM, DOT_F32, STAGES)
    else:  # prefill: this task takes every num_tasks-th wide tile, row blocks innermost (weights shared in L2)
        N = word(desc, 4)
        num_tasks = tl.cdiv(N, BN)
        row_blocks = tl.cdiv(num_rows, BMW)
        for item in range(tile, row_blocks * tl.cdiv(N, BNW), num_tasks):
            dot_block(desc, (item % row_blocks) * BMW, (item // row_blocks) * BNW, num_rows, W, ACT, F32, PROLOGUE,
                      BMW, BNW, BKD, DOT_F32, STAGES)


@triton.jit
def linear_task(desc, tile, W, ACT, F32, num_tokens, num_seqs, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, BKM: tl.constexpr, BMW: tl.constexpr, BNW: tl.constexpr, BKD: tl.constexpr,
                DOT_F32: tl.constexpr, STAGES: tl.constexpr):
    """BK, BKM, BKD: the K chunk of the GEMV, of the few-row dots (weights and inputs both staged), of the
    wide prefill tiles."""
    num_rows = tl.where(word(desc, 16) == 1, num_seqs, num_tokens)
    prologue = word(desc, 8)
    if prologue == 1:
        linear_rows(desc, tile, num_rows, W, ACT, F32, 1, BM, BN, BK, BKM, BMW, BNW, BKD, DOT_F32, STAGES)
    elif prologue == 2:
        linear_rows(desc, tile, num_rows, W, ACT, F32, 2, BM, BN, BK, BKM, BMW, BNW, BKD, DOT_F32, STAGES)
    else:
        linear_rows(desc, tile, num_rows, W, ACT, F32, 0, BM, BN, BK, BKM, BMW, BNW, BKD, DOT_F32, STAGES)
