"""The QKV projection of one head, with its epilogue: per-head q/k RMSNorm (Qwen3), rotary, and the append
of k and v to the paged cache. q heads go to the activation buffer the attention reads."""
import triton
import triton.language as tl

from codegen.bodies.common import SHORT_PREFILL, SPLIT_SLICE_ROWS, STEP_KEYS, round_to, row_halves, split_slices
from codegen.bodies.common import sum_of_splits, sum_split_rows, word, word8, word_f32
from codegen.bodies.linear import row_inv_rms, tile_product

QKV_FIELDS = ("x_off", "k", "w_off", "num_q_heads", "num_kv_heads", "head_dim", "rotary_dim", "stats_off",
              "eps", "bias_off", "q_norm_off", "k_norm_off", "qk_eps", "q_out_off", "layer", "rope_off",
              "has_qk_norm", "splits", "part_off", "ticket_off", "num_tasks", "step_kv_off")
# step_kv_off: k and v also go to a row a token there ([K heads, V heads]), for prefill attention's descriptors
# (`codegen.bodies.attention.attend_step`); -1: only to the cache


@triton.jit
def rotate(y, cols, pos, F32, rope_off, RD, dt: tl.constexpr, FULL: tl.constexpr):
    """HF's rotate_half rotary on the first RD columns of each row of y [BM, HDP], with each position's
    cos and sin from the table at `rope_off` (row p: RD / 2 cosines, then RD / 2 sines; the runtime fills
    it. Computed here, fp32 cos and sin of large angles, a slow path of many instructions, held half as
    many of ncu's samples as the QKV prefill's K loop on the H100). FULL: RD is the whole padded head, so
    the halves are split apart in registers instead of gathered (a gather of a [64, 128] tile goes through
    shared memory and spills)."""
    angles = F32 + rope_off + pos[:, None] * RD
    if FULL:
        HALF: tl.constexpr = y.shape[1] // 2
        lo, hi = tl.split(tl.permute(tl.reshape(y, (y.shape[0], 2, HALF)), (0, 2, 1)))
        j = tl.arange(0, HALF)[None, :]
        cos, sin = round_to(tl.load(angles + j), dt), round_to(tl.load(angles + HALF + j), dt)
        out_lo = round_to(round_to(lo * cos, dt) + round_to(-hi * sin, dt), dt)
        out_hi = round_to(round_to(hi * cos, dt) + round_to(lo * sin, dt), dt)
        return tl.reshape(tl.permute(tl.join(out_lo, out_hi), (0, 2, 1)), y.shape)
    else:
        half = RD // 2
        partner = tl.where(cols < half, cols + half, tl.where(cols < RD, cols - half, cols))
        sign = tl.where(cols < half, -1.0, 1.0)
        rotated = tl.gather(y, tl.broadcast_to(partner[None, :], y.shape), 1) * sign[None, :]
        j = tl.where(cols < half, cols, cols - half)[None, :]
        rotary = (cols < RD)[None, :]
        cos = round_to(tl.load(angles + j, mask=rotary, other=0.0), dt)
        sin = round_to(tl.load(angles + half + j, mask=rotary, other=0.0), dt)
        out = round_to(round_to(y * cos, dt) + round_to(rotated * sin, dt), dt)
        return tl.where(cols[None, :] < RD, out, y)


@triton.jit
def head_norm(y, d_ok, W, norm_off, HD, eps, dt: tl.constexpr):
    w = tl.load(W + norm_off + tl.arange(0, y.shape[1]), mask=d_ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(tl.where(d_ok[None, :], y * y, 0.0), 1) / HD.to(tl.float32) + eps)
    return round_to(round_to(y * inv[:, None], dt) * w[None, :], dt)


@triton.jit
def head_partial(desc, head, k_lo, k_hi, rows, row_ok, W, ACT, F32, BK: tl.constexpr, HDP: tl.constexpr,
                 DOT_F32: tl.constexpr, STAGES: tl.constexpr, EVEN_K: tl.constexpr, EVEN_D: tl.constexpr):
    """[rows, HDP] fp32 partial projection of one head over input columns k_lo .. k_hi, scaled by the rows'
    1/rms (the norm weight is folded into the placed weight). One row streams as a GEMV ([HDP, BK] fp32
    accumulator, reduced at the end), more rows on tensor cores. EVEN_K: k_lo and k_hi are multiples of BK;
    EVEN_D: every head's dimensions fill HDP (`codegen.lower.even_heads`)."""
    x_off, K, w_off, HD = word8(desc, 0), word8(desc, 1), word8(desc, 2), word8(desc, 5)
    stats_off, eps = word(desc, 7), word_f32(desc, 8)
    cols = tl.arange(0, HDP)
    d_ok = cols < HD
    w_rows = W + w_off + (head * HD + cols)[:, None].to(tl.int64) * K
    x_rows = ACT + x_off + rows[:, None].to(tl.int64) * K
    if rows.shape[0] == 1:
        acc = tl.zeros((HDP, BK), tl.float32)
    else:
        acc = tl.zeros((rows.shape[0], HDP), tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        ks = k0 + tl.arange(0, BK)
        k_ok = (ks < k_hi) | EVEN_K  # (as in `tile_product`)
        if EVEN_K and EVEN_D:  # (as in `tile_product`: no mask at all)
            w = tl.load(w_rows + ks[None, :])
        else:
            w = tl.load(w_rows + ks[None, :], mask=d_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if rows.shape[0] == 1:
            acc += w.to(tl.float32) * x.to(tl.float32)
        elif DOT_F32:
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    inv = row_inv_rms(F32, stats_off, rows, row_ok, K, eps)
    if rows.shape[0] == 1:
        return tl.sum(acc, 1)[None, :] * inv[:, None]
    else:
        return acc * inv[:, None]


@triton.jit
def head_epilogue(desc, head, acc, rows, row_ok, W, ACT, F32, I32, KV, kv_plane, POSITIONS: tl.constexpr,
                  SLOTS: tl.constexpr, HDP: tl.constexpr, FULL_ROTARY: tl.constexpr):
    """Bias, per-head q/k norm, rotary, then the q buffer or the paged KV cache."""
    HQ, HKV, HD, RD = word(desc, 3), word(desc, 4), word8(desc, 5), word(desc, 6)
    bias_off, q_norm_off, k_norm_off, qk_eps = word(desc, 9), word(desc, 10), word(desc, 11), word_f32(desc, 12)
    q_out_off, layer, rope_off, has_qk_norm = word8(desc, 13), word(desc, 14), word(desc, 15), word(desc, 16)
    dt: tl.constexpr = W.dtype.element_ty
    cols = tl.arange(0, HDP)
    d_ok = cols < HD
    bias = tl.load(W + bias_off + head * HD + cols, mask=d_ok & (bias_off >= 0), other=0.0).to(tl.float32)
    y = round_to(acc + bias[None, :], dt)
    if head < HQ + HKV:
        if has_qk_norm == 1:
            y = head_norm(y, d_ok, W, tl.where(head < HQ, q_norm_off, k_norm_off), HD, qk_eps, dt)
        pos = tl.load(I32 + POSITIONS + rows, mask=row_ok, other=0)
        y = rotate(y, cols, pos, F32, rope_off, RD, dt, FULL_ROTARY)
    mask = row_ok[:, None] & d_ok[None, :]
    if head < HQ:
        tl.store(ACT + q_out_off + rows[:, None] * (HQ * HD) + head * HD + cols[None, :], y.to(dt), mask=mask)
    else:
        slot = tl.load(I32 + SLOTS + rows, mask=row_ok, other=0).to(tl.int64)
        plane = tl.where(head < HQ + HKV, 0, 1)
        kv_head = head - HQ - plane * HKV
        base = KV + tl.multiple_of((layer * 2 + plane) * kv_plane, 8) + kv_head * HD
        tl.store(base + slot[:, None] * (HKV * HD) + cols[None, :], y.to(dt), mask=mask)
        if STEP_KEYS:  # ... and to the step's rows, for prefill attention's descriptors (`attend_step`)
            step_kv = ACT + word8(desc, 21) + (head - HQ) * HD
            tl.store(step_kv + rows[:, None] * (2 * HKV * HD) + cols[None, :], y.to(dt), mask=mask)


@triton.jit
def split_head(desc, head, split, rows, row_ok, W, ACT, F32, I32, KV, kv_plane, POSITIONS: tl.constexpr,
               SLOTS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, HDP: tl.constexpr, DOT_F32: tl.constexpr,
               STAGES: tl.constexpr, FULL_ROTARY: tl.constexpr, EVEN_K: tl.constexpr, EVEN_D: tl.constexpr):
    """A decode step's share of one head: K columns split .. of `splits`; the last split to finish (a ticket
    counter the planner zeroes every step) sums the fp32 partials in order and runs the epilogue, or, over more
    than SPLIT_SLICE_ROWS rows, the splits do so a slice of rows at a time (`split_slices`)."""
    K, splits, part_off, ticket_off = word8(desc, 1), word(desc, 17), word(desc, 18), word(desc, 19)
    chunk = tl.cdiv(tl.cdiv(K, splits), BK) * BK
    k_lo = split * chunk
    k_hi = tl.multiple_of(tl.minimum(K, k_lo + chunk), 8)  # both are: keeps the K mask vector-wide
    acc = head_partial(desc, head, k_lo, k_hi, rows, row_ok, W, ACT, F32, BK, HDP, DOT_F32, STAGES, EVEN_K, EVEN_D)
    if splits == 1:
        head_epilogue(desc, head, acc, rows, row_ok, W, ACT, F32, I32, KV, kv_plane, POSITIONS, SLOTS, HDP,
                      FULL_ROTARY)
    elif (SPLIT_SLICE_ROWS > 0) and (BM > SPLIT_SLICE_ROWS):  # the splits finish the head a slice each
        num_rows = tl.sum(row_ok.to(tl.int32))
        base, first, step = split_slices(F32, I32, part_off, ticket_off, head, split, splits, acc, num_rows,
                                         SPLIT_SLICE_ROWS)
        for q in range(first, tl.cdiv(num_rows, SPLIT_SLICE_ROWS), step):
            r = q * SPLIT_SLICE_ROWS + tl.arange(0, SPLIT_SLICE_ROWS)
            total = sum_split_rows(F32, base, splits, q * SPLIT_SLICE_ROWS, BM, HDP, SPLIT_SLICE_ROWS)
            head_epilogue(desc, head, total, r, r < num_rows, W, ACT, F32, I32, KV, kv_plane, POSITIONS, SLOTS, HDP,
                          FULL_ROTARY)
    else:
        last, total = sum_of_splits(F32, part_off, ticket_off, head, split, splits, acc, rows, BM)
        if last:
            head_epilogue(desc, head, total, rows, row_ok, W, ACT, F32, I32, KV, kv_plane, POSITIONS, SLOTS, HDP,
                          FULL_ROTARY)


@triton.jit
def qkv_rows(desc, head, split, num_tokens, W, ACT, F32, I32, KV, kv_plane, POSITIONS: tl.constexpr,
             SLOTS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, HDP: tl.constexpr, DOT_F32: tl.constexpr,
             STAGES: tl.constexpr, FULL_ROTARY: tl.constexpr, EVEN_K: tl.constexpr, EVEN_D: tl.constexpr):
    """Up to BM rows of (head, split): one row as a GEMV, more on 16-row dots (not wgmma: `outline` can make
    this a function of its own)."""
    if num_tokens == 1:
        split_head(desc, head, split, tl.arange(0, 1), tl.arange(0, 1) < 1, W, ACT, F32, I32, KV, kv_plane,
                   POSITIONS, SLOTS, BM, BK, HDP, DOT_F32, STAGES, FULL_ROTARY, EVEN_K, EVEN_D)
    else:
        split_head(desc, head, split, tl.arange(0, BM), tl.arange(0, BM) < num_tokens, W, ACT, F32, I32, KV,
                   kv_plane, POSITIONS, SLOTS, BM, BK, HDP, DOT_F32, STAGES, FULL_ROTARY, EVEN_K, EVEN_D)


@triton.jit
def qkv_task(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS: tl.constexpr,
             SLOTS: tl.constexpr, BM: tl.constexpr, BMW: tl.constexpr, BMP: tl.constexpr, BK: tl.constexpr,
             BKP: tl.constexpr, HDP: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
             FULL_ROTARY: tl.constexpr, BKD: tl.constexpr, PREFILL_STAGES: tl.constexpr, PREFILL_TMA: tl.constexpr,
             EVEN_K: tl.constexpr, EVEN_D: tl.constexpr, BMQ: tl.constexpr):
    """Task (head, split). A step of up to BMP rows (decode, batched decode) splits each head's K range over
    `splits` tasks (K chunks of BKP where more than BM rows are staged: BMW of them up to BMW, the batched
    decode's rows, if fewer than BMP); longer (prefill) steps share the (head, BMQ rows) tiles instead, loaded
    as the projections' prefill tiles are (chunks of BKD, PREFILL_STAGES deep, through tensor descriptors with
    PREFILL_TMA). The group's tasks past the (head, split) ones (`num_tasks`, one a program) only prefill.
    EVEN_K, EVEN_D: every K chunk of the pointer tiles is whole, every head fills HDP (`head_partial`). BMQ: the
    prefill tiles' rows (`CompileConfig.qkv_prefill_rows`)."""
    splits = word(desc, 17)
    head = tile // splits
    split = tile % splits
    if head >= word(desc, 3) + 2 * word(desc, 4):
        if num_tokens > BMP:
            qkv_prefill_rows(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS, SLOTS, BMP, BMQ, HDP,
                             DOT_F32, FULL_ROTARY, BKD, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_D)
    elif num_tokens <= BM:
        qkv_rows(desc, head, split, num_tokens, W, ACT, F32, I32, KV, kv_plane, POSITIONS, SLOTS, BM, BK, HDP,
                 DOT_F32, STAGES, FULL_ROTARY, EVEN_K, EVEN_D)
    elif BMW < BMP and num_tokens <= BMW:
        split_head(desc, head, split, tl.arange(0, BMW), tl.arange(0, BMW) < num_tokens, W, ACT, F32, I32, KV,
                   kv_plane, POSITIONS, SLOTS, BMW, BKP, HDP, DOT_F32, STAGES, FULL_ROTARY, EVEN_K, EVEN_D)
    elif num_tokens <= BMP:
        split_head(desc, head, split, tl.arange(0, BMP), tl.arange(0, BMP) < num_tokens, W, ACT, F32, I32, KV,
                   kv_plane, POSITIONS, SLOTS, BMP, BKP, HDP, DOT_F32, STAGES, FULL_ROTARY, EVEN_K, EVEN_D)
    else:
        qkv_prefill_rows(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS, SLOTS, BMP, BMQ, HDP,
                         DOT_F32, FULL_ROTARY, BKD, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_D)


@triton.jit
def qkv_prefill_rows(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS: tl.constexpr,
                     SLOTS: tl.constexpr, QKV_M: tl.constexpr, BMQ: tl.constexpr, HDP: tl.constexpr,
                     DOT_F32: tl.constexpr, FULL_ROTARY: tl.constexpr, BKD: tl.constexpr,
                     PREFILL_STAGES: tl.constexpr, PREFILL_TMA: tl.constexpr, EVEN_K: tl.constexpr,
                     EVEN_D: tl.constexpr):
    """`qkv_prefill` on BMQ-row tiles, or on 64-row ones (at least QKV_M, the decode blocks' `qkv_block_m`) where
    the step has at most SHORT_PREFILL tokens and BMQ is more (`CompileConfig.short_prefill_tokens`)."""
    SHORT: tl.constexpr = 64 if QKV_M < 64 else QKV_M
    if (SHORT_PREFILL > 0) and (BMQ > SHORT):
        if num_tokens <= SHORT_PREFILL:
            qkv_prefill(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS, SLOTS, SHORT, HDP,
                        DOT_F32, FULL_ROTARY, BKD, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_D)
        else:
            qkv_prefill(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS, SLOTS, BMQ, HDP,
                        DOT_F32, FULL_ROTARY, BKD, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_D)
    else:
        qkv_prefill(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS, SLOTS, BMQ, HDP, DOT_F32,
                    FULL_ROTARY, BKD, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_D)


@triton.jit
def qkv_prefill(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, POSITIONS: tl.constexpr,
                SLOTS: tl.constexpr, BMP: tl.constexpr, HDP: tl.constexpr, DOT_F32: tl.constexpr,
                FULL_ROTARY: tl.constexpr, BKD: tl.constexpr, PREFILL_STAGES: tl.constexpr,
                PREFILL_TMA: tl.constexpr, EVEN_K: tl.constexpr, EVEN_D: tl.constexpr):
    """A prefill step: the group's tasks share the (head, row block) tiles, row blocks innermost, as the
    projections' prefill tiles (the tasks running at once share a few heads' weights in L2)."""
    x_off, K, w_off, HD = word8(desc, 0), word8(desc, 1), word8(desc, 2), word(desc, 5)
    stats_off, eps = word(desc, 7), word_f32(desc, 8)
    num_heads = word(desc, 3) + 2 * word(desc, 4)
    row_blocks = tl.cdiv(num_tokens, BMP)
    for item in range(tile, num_heads * row_blocks, word(desc, 20)):
        m0 = (item % row_blocks) * BMP
        acc = tile_product(x_off, K, K, w_off, num_heads * HD, m0, item // row_blocks * HD, 0, K, num_tokens,
                           W, ACT, BMP, HDP, BKD, DOT_F32, PREFILL_STAGES, PREFILL_TMA, EVEN_K, EVEN_D)
        if BMP > 64:  # the epilogue a half at a time, as the projections' 128-row tiles (`row_halves`)
            top, bottom = row_halves(acc)
            _prefill_epilogue(desc, item // row_blocks, top, m0, num_tokens, K, stats_off, eps, HD, W, ACT, F32, I32,
                              KV, kv_plane, POSITIONS, SLOTS, HDP, FULL_ROTARY)
            _prefill_epilogue(desc, item // row_blocks, bottom, m0 + BMP // 2, num_tokens, K, stats_off, eps, HD, W,
                              ACT, F32, I32, KV, kv_plane, POSITIONS, SLOTS, HDP, FULL_ROTARY)
        else:
            _prefill_epilogue(desc, item // row_blocks, acc, m0, num_tokens, K, stats_off, eps, HD, W, ACT, F32, I32,
                              KV, kv_plane, POSITIONS, SLOTS, HDP, FULL_ROTARY)


@triton.jit
def _prefill_epilogue(desc, head, acc, m0, num_tokens, K, stats_off, eps, HD, W, ACT, F32, I32, KV, kv_plane,
                      POSITIONS: tl.constexpr, SLOTS: tl.constexpr, HDP: tl.constexpr, FULL_ROTARY: tl.constexpr):
    """Rows m0 .. of a prefill tile: the norm's row scales, then `head_epilogue`."""
    rows = m0 + tl.arange(0, acc.shape[0])
    row_ok = rows < num_tokens
    inv = row_inv_rms(F32, stats_off, rows, row_ok, K, eps)
    acc = tl.where((tl.arange(0, HDP) < HD)[None, :], acc * inv[:, None], 0.0)  # past HD: the next head
    head_epilogue(desc, head, acc, rows, row_ok, W, ACT, F32, I32, KV, kv_plane, POSITIONS, SLOTS, HDP, FULL_ROTARY)
