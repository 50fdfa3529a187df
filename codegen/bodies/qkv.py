"""The QKV projection of one head, with its epilogue: per-head q/k RMSNorm (Qwen3), rotary, and the append
of k and v to the paged cache. q heads go to the activation buffer the attention reads."""
import triton
import triton.language as tl

from codegen.bodies.common import round_to, word, word_f32

QKV_FIELDS = ("x_off", "k", "w_off", "num_q_heads", "num_kv_heads", "head_dim", "rotary_dim", "stats_off",
              "norm_w_off", "eps", "bias_off", "q_norm_off", "k_norm_off", "qk_eps", "q_out_off", "layer",
              "inv_freq_off", "has_norm", "has_qk_norm")


@triton.jit
def rotate(y, cols, pos, F32, inv_freq_off, RD, dt: tl.constexpr):
    """HF's rotate_half rotary on the first RD columns of each row of y [BM, HDP]."""
    half = RD // 2
    partner = tl.where(cols < half, cols + half, tl.where(cols < RD, cols - half, cols))
    sign = tl.where(cols < half, -1.0, 1.0)
    rotated = tl.gather(y, tl.broadcast_to(partner[None, :], y.shape), 1) * sign[None, :]
    freq = tl.load(F32 + inv_freq_off + tl.where(cols < half, cols, cols - half), mask=cols < RD, other=0.0)
    angle = pos.to(tl.float32)[:, None] * freq[None, :]
    cos, sin = round_to(tl.cos(angle), dt), round_to(tl.sin(angle), dt)
    out = round_to(round_to(y * cos, dt) + round_to(rotated * sin, dt), dt)
    return tl.where(cols[None, :] < RD, out, y)


@triton.jit
def head_norm(y, d_ok, W, norm_off, HD, eps, dt: tl.constexpr):
    w = tl.load(W + norm_off + tl.arange(0, y.shape[1]), mask=d_ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(tl.where(d_ok[None, :], y * y, 0.0), 1) / HD.to(tl.float32) + eps)
    return round_to(round_to(y * inv[:, None], dt) * w[None, :], dt)


@triton.jit
def qkv_task(desc, head, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS: tl.constexpr,
             SLOTS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, HDP: tl.constexpr, DOT_F32: tl.constexpr):
    x_off, K, w_off = word(desc, 0), word(desc, 1), word(desc, 2)
    HQ, HKV, HD, RD = word(desc, 3), word(desc, 4), word(desc, 5), word(desc, 6)
    stats_off, norm_w_off, eps, bias_off = word(desc, 7), word(desc, 8), word_f32(desc, 9), word(desc, 10)
    q_norm_off, k_norm_off, qk_eps, q_out_off = word(desc, 11), word(desc, 12), word_f32(desc, 13), word(desc, 14)
    layer, inv_freq_off, has_norm, has_qk_norm = word(desc, 15), word(desc, 16), word(desc, 17), word(desc, 18)
    dt: tl.constexpr = W.dtype.element_ty
    cols = tl.arange(0, HDP)
    d_ok = cols < HD
    wrows = head * HD + cols
    bias = tl.load(W + bias_off + wrows, mask=d_ok & (bias_off >= 0), other=0.0).to(tl.float32)
    for m0 in range(0, num_tokens, BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < num_tokens
        sumsq = tl.load(F32 + stats_off + rows, mask=row_ok & (has_norm == 1), other=1.0)
        inv = tl.rsqrt(sumsq / K.to(tl.float32) + eps)
        acc = tl.zeros((BM, HDP), tl.float32)
        for k0 in range(0, K, BK):
            ks = k0 + tl.arange(0, BK)
            k_ok = ks < K
            x = tl.load(ACT + x_off + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0).to(tl.float32)
            if has_norm == 1:
                nw = tl.load(W + norm_w_off + ks, mask=k_ok, other=0.0).to(tl.float32)
                x = round_to(round_to(x * inv[:, None], dt) * nw[None, :], dt)
            w = tl.load(W + w_off + wrows[:, None] * K + ks[None, :], mask=d_ok[:, None] & k_ok[None, :], other=0.0)
            if DOT_F32:
                acc += tl.dot(x, tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(x.to(dt), tl.trans(w))
        y = round_to(acc + bias[None, :], dt)
        if head < HQ + HKV:
            if has_qk_norm == 1:
                y = head_norm(y, d_ok, W, tl.where(head < HQ, q_norm_off, k_norm_off), HD, qk_eps, dt)
            pos = tl.load(I32 + POSITIONS + rows, mask=row_ok, other=0)
            y = rotate(y, cols, pos, F32, inv_freq_off, RD, dt)
        mask = row_ok[:, None] & d_ok[None, :]
        if head < HQ:
            tl.store(ACT + q_out_off + rows[:, None] * (HQ * HD) + head * HD + cols[None, :], y.to(dt), mask=mask)
        else:
            slot = tl.load(I32 + SLOTS + rows, mask=row_ok, other=0).to(tl.int64)
            plane = tl.where(head < HQ + HKV, 0, 1)
            kv_head = head - HQ - plane * HKV
            base = KV + (layer * 2 + plane) * kv_plane + kv_head * HD
            tl.store(base + slot[:, None] * (HKV * HD) + cols[None, :], y.to(dt), mask=mask)
