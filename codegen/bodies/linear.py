"""Projection tiles: `fused_linear` and the LM head.

One task computes BN output columns for every row of the step: prologue on the input chunk (RMSNorm from
the producer's sum of squares, or SiLU-gating), tensor-core dots, bias, residual add, store, and the
sum of squares of the stored rows when a norm reads the output.
"""
import triton
import triton.language as tl

from codegen.bodies.common import round_to, word, word8, word_f32

LINEAR_FIELDS = ("x_off", "x_stride", "k", "w_off", "n", "out_off", "out_stride", "out_f32", "prologue",
                 "stats_off", "norm_w_off", "eps", "res_off", "res_stride", "bias_off", "out_stats_off",
                 "rows_kind")
PROLOGUE_CODES = {"none": 0, "rms_norm": 1, "silu_mul": 2}


@triton.jit
def load_input_chunk(ACT, W, F32, x_off, x_stride, K, rows, row_ok, ks, k_ok, prologue, inv, norm_w_off,
                     dt: tl.constexpr):
    """The [BM, BK] input chunk after the prologue, in fp32 (values rounded to the model dtype)."""
    mask = row_ok[:, None] & k_ok[None, :]
    x = tl.load(ACT + x_off + rows[:, None] * x_stride + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    if prologue == 1:
        nw = tl.load(W + norm_w_off + ks, mask=k_ok, other=0.0).to(tl.float32)
        x = round_to(round_to(x * inv[:, None], dt) * nw[None, :], dt)
    elif prologue == 2:
        up = tl.load(ACT + x_off + rows[:, None] * x_stride + K + ks[None, :], mask=mask, other=0.0).to(tl.float32)
        x = round_to(round_to(x / (1.0 + tl.exp(-x)), dt) * up, dt)
    return x


@triton.jit
def project_rows(desc, tile, W, ACT, F32, m0, num_rows, ROWS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr):
    """Output rows m0 .. m0 + ROWS of this tile: tensor-core dots for row blocks, or for a single row
    (batch-1 decode) a GEMV whose fp32 accumulator is one value per output column."""
    x_off, x_stride, K = word8(desc, 0), word8(desc, 1), word8(desc, 2)
    w_off, N, out_off, out_stride = word8(desc, 3), word(desc, 4), word8(desc, 5), word(desc, 6)
    out_f32, prologue, stats_off, norm_w_off = word(desc, 7), word(desc, 8), word(desc, 9), word(desc, 10)
    eps, res_off, res_stride = word_f32(desc, 11), word(desc, 12), word8(desc, 13)
    bias_off, out_stats_off = word(desc, 14), word(desc, 15)
    dt: tl.constexpr = W.dtype.element_ty
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < N
    rows = m0 + tl.arange(0, ROWS)
    row_ok = rows < num_rows
    sumsq = tl.load(F32 + stats_off + rows, mask=row_ok & (prologue == 1), other=1.0)
    inv = tl.rsqrt(sumsq / K.to(tl.float32) + eps)
    acc = tl.zeros((ROWS, BN), tl.float32)
    w_rows = W + w_off + cols[:, None] * K
    w_next = tl.load(w_rows + tl.arange(0, BK)[None, :], mask=col_ok[:, None] & (tl.arange(0, BK) < K)[None, :],
                     other=0.0)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        # the next chunk of weights is in flight while this one is used: weights never wait on activations
        w = w_next
        nks = k0 + BK + tl.arange(0, BK)
        w_next = tl.load(w_rows + nks[None, :], mask=col_ok[:, None] & (nks < K)[None, :], other=0.0)
        ks = k0 + tl.arange(0, BK)
        k_ok = ks < K
        x = load_input_chunk(ACT, W, F32, x_off, x_stride, K, rows, row_ok, ks, k_ok, prologue, inv, norm_w_off, dt)
        if USE_DOT:
            if DOT_F32:
                acc += tl.dot(x, tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x.to(dt), tl.trans(w))
        else:
            acc += tl.sum(w.to(tl.float32) * x, 1)[None, :]
    bias = tl.load(W + bias_off + cols, mask=col_ok & (bias_off >= 0), other=0.0).to(tl.float32)
    y = round_to(acc + bias[None, :], dt)
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
def linear_task(desc, tile, W, ACT, F32, num_tokens, num_seqs, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr):
    num_rows = tl.where(word(desc, 16) == 1, num_seqs, num_tokens)
    if num_rows == 1:
        project_rows(desc, tile, W, ACT, F32, 0, num_rows, 1, BN, BK, False, DOT_F32, STAGES)
    else:
        for m0 in range(0, num_rows, BM):
            project_rows(desc, tile, W, ACT, F32, m0, num_rows, BM, BN, BK, True, DOT_F32, STAGES)
