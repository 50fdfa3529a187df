"""Row-wise tasks over a BN-column tile of every row: embedding lookup, row gather (the rows that need
logits), standalone RMSNorm, residual add. Producers of a value that a norm reads add each row's sum
of squares (of the stored values) into its statistics buffer."""
import triton
import triton.language as tl

from codegen.bodies.common import add_norm_sums, norm_sums, round_to, word, word8, word_f32

EMBED_FIELDS = ("table_off", "hidden", "out_off", "out_stats_off")  # both copy_rows: (source offset, ...)
GATHER_FIELDS = ("x_off", "hidden", "out_off", "out_stats_off")
RMS_NORM_FIELDS = ("x_off", "hidden", "stats_off", "norm_w_off", "eps", "out_off", "rows_kind")
ADD_FIELDS = ("a_off", "b_off", "hidden", "out_off", "out_stats_off", "rows_kind")


@triton.jit
def store_rows(ACT, F32, out_off, hidden, rows, row_ok, cols, col_ok, y, out_stats_off, dt: tl.constexpr):
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(ACT + out_off + rows[:, None] * hidden + cols[None, :], y.to(dt), mask=mask)
    if out_stats_off >= 0:
        add_norm_sums(F32, out_stats_off, rows, row_ok, y, mask)


@triton.jit
def copy_rows(desc, tile, SRC, ACT, F32, index, num_rows, BM: tl.constexpr, BN: tl.constexpr):
    """out[i, tile's columns] = SRC[src_off + index[i] * hidden + columns] for i < num_rows."""
    src_off, hidden, out_off, out_stats_off = word8(desc, 0), word8(desc, 1), word8(desc, 2), word(desc, 3)
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < hidden
    for m0 in range(0, num_rows, BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < num_rows
        src = tl.load(index + rows, mask=row_ok, other=0).to(tl.int64)
        y = tl.load(SRC + src_off + src[:, None] * hidden + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        store_rows(ACT, F32, out_off, hidden, rows, row_ok, cols, col_ok, y, out_stats_off, ACT.dtype.element_ty)


@triton.jit
def embed_task(desc, tile, W, ACT, F32, I32, num_tokens, INPUT_IDS: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr):
    """Rows of the embedding table (weights) by token id."""
    copy_rows(desc, tile, W, ACT, F32, I32 + INPUT_IDS, num_tokens, BM, BN)


@triton.jit
def gather_task(desc, tile, ACT, F32, I32, num_seqs, LOGITS_ROWS: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr):
    """The activation rows that need logits (each sequence's last token of the step)."""
    copy_rows(desc, tile, ACT, ACT, F32, I32 + LOGITS_ROWS, num_seqs, BM, BN)


@triton.jit
def rms_norm_task(desc, tile, W, ACT, F32, num_tokens, num_seqs, BM: tl.constexpr, BN: tl.constexpr):
    x_off, hidden, stats_off, norm_w_off = word8(desc, 0), word8(desc, 1), word(desc, 2), word(desc, 3)
    eps, out_off = word_f32(desc, 4), word8(desc, 5)
    num_rows = tl.where(word(desc, 6) == 1, num_seqs, num_tokens)
    dt: tl.constexpr = ACT.dtype.element_ty
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < hidden
    w = tl.load(W + norm_w_off + cols, mask=col_ok, other=0.0).to(tl.float32)
    for m0 in range(0, num_rows, BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < num_rows
        sumsq = tl.load(norm_sums(F32, stats_off) + rows, mask=row_ok, other=1.0).to(tl.float32)
        inv = tl.rsqrt(sumsq / hidden.to(tl.float32) + eps)
        x = tl.load(ACT + x_off + rows[:, None] * hidden + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        y = round_to(round_to(x * inv[:, None], dt) * w[None, :], dt)
        store_rows(ACT, F32, out_off, hidden, rows, row_ok, cols, col_ok, y, -1, dt)


@triton.jit
def add_task(desc, tile, ACT, F32, num_tokens, num_seqs, BM: tl.constexpr, BN: tl.constexpr):
    a_off, b_off, hidden, out_off = word8(desc, 0), word8(desc, 1), word8(desc, 2), word8(desc, 3)
    out_stats_off = word(desc, 4)
    num_rows = tl.where(word(desc, 5) == 1, num_seqs, num_tokens)
    dt: tl.constexpr = ACT.dtype.element_ty
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < hidden
    for m0 in range(0, num_rows, BM):
        rows = m0 + tl.arange(0, BM)
        row_ok = rows < num_rows
        mask = row_ok[:, None] & col_ok[None, :]
        a = tl.load(ACT + a_off + rows[:, None] * hidden + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(ACT + b_off + rows[:, None] * hidden + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        store_rows(ACT, F32, out_off, hidden, rows, row_ok, cols, col_ok, round_to(a + b, dt), out_stats_off, dt)
