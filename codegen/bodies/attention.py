"""Paged causal attention of one sequence and one KV head (all query heads of its group, every query
token of the step): flash-attention's online softmax over the sequence's pages.

At decode (the group's query rows fit one block) the context is split over `splits` tasks; each stores
its partial (running max, sum, unnormalised output), and a group of its own merges them (`merge_head`, a
task a sequence and query head: the merge then waits on one signal and runs on many programs), or the last
split to finish does (`_merge_parts`). At
prefill every task of the group shares the step's query row blocks, round by round, in a zigzag that gives a
task long and short causal blocks alike.
"""
import triton
import triton.language as tl

from codegen.bodies.common import STEP_KEYS, arrives_last, round_to, word, word8, word_f32

ATTENTION_FIELDS = ("q_off", "out_off", "num_heads", "num_kv_heads", "head_dim", "layer", "scale", "splits",
                    "part_off", "ticket_off", "num_tasks", "merger", "step_kv_off")
# merger: 0, the last split of a (sequence, KV head) merges its splits; 1, they only store their partials, and
# a group of its own merges them (task (sequence, query head)); 2, this is that group. step_kv_off: where the
# QKV epilogue also wrote the step's keys and values, a row a token ([K heads, V heads]; -1: nowhere)
NEG = tl.constexpr(-1.0e30)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def attend(q, q_pos, j_lo, j_hi, pages, k_base, v_base, row_stride, d, d_ok, scale, PAGE_SIZE: tl.constexpr,
           BKV: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, WINDOW: tl.constexpr,
           BF16_SCORES: tl.constexpr):
    """(running max [BM], sum [BM], unnormalised output [BM, HDP]) over keys j_lo .. j_hi of the pages, WINDOW
    blocks of BKV keys at a time (`attend_pages`), the max in the merge's units (`attention_end`)."""
    m_i, l_i, acc = attention_start(q)
    m_i, l_i, acc = attend_pages(q, q_pos, j_lo, j_hi, pages, k_base, v_base, row_stride, d, d_ok, scale, m_i, l_i,
                                 acc, PAGE_SIZE, BKV, DOT_F32, STAGES, WINDOW, BF16_SCORES)
    return attention_end(m_i, scale, BF16_SCORES), l_i, acc


@triton.jit
def attention_start(q):
    """The online softmax's state before any key: running max, sum and unnormalised output of q's rows."""
    return tl.full((q.shape[0],), NEG, tl.float32), tl.zeros((q.shape[0],), tl.float32), tl.zeros(q.shape, tl.float32)


@triton.jit
def attention_end(m_i, scale, BF16_SCORES: tl.constexpr):
    """The running max in the merge's units (scaled scores; the key loops keep it in units of raw scores)."""
    if BF16_SCORES:
        return m_i
    else:
        return m_i * scale


@triton.jit
def attend_block(q, k, v, j, j_hi, q_pos, m_i, l_i, acc, scale, DOT_F32: tl.constexpr, BF16_SCORES: tl.constexpr):
    """Keys j (k, v: [BKV, HDP]) folded into the state: causal (no key after a row's position q_pos) and below
    j_hi. BF16_SCORES rounds each score to the activations' type before and after its scaling, as eager
    attention's matmul and multiply store them; else the scores stay fp32 and the scale goes into the
    exponent's FMA, as in SDPA's and flash attention's kernels."""
    dt: tl.constexpr = q.dtype
    if DOT_F32:
        s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    # exp(scale (s - m)) as 2^(s c - m c), one FMA and the ex2 a score; m_i and the scores in units of s
    if BF16_SCORES:
        s = round_to(round_to(s, dt) * scale, dt)
        c = LOG2E
    else:
        c = scale * LOG2E
    s = tl.where((j[None, :] <= q_pos[:, None]) & (j < j_hi)[None, :], s, NEG)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s * c - (m_new * c)[:, None])
    alpha = tl.exp2((m_i - m_new) * c)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_F32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(dt), v)
    return m_new, l_i, acc * alpha[:, None] + pv


@triton.jit
def attend_pages(q, q_pos, j_lo, j_hi, pages, k_base, v_base, row_stride, d, d_ok, scale, m_i, l_i, acc,
                 PAGE_SIZE: tl.constexpr, BKV: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr,
                 WINDOW: tl.constexpr, BF16_SCORES: tl.constexpr):
    """The state after keys j_lo .. j_hi, read from the pages a thread's copies at a time, WINDOW blocks of BKV
    keys at a time."""
    # key positions in int32 (the descriptor's words are int64, and so is what comes of them): the causal and
    # length masks then take one compare a score rather than two, and the key index one add
    q_pos, j_hi = q_pos.to(tl.int32), j_hi.to(tl.int32)
    # the page ids of a window of WINDOW blocks are read before the window's loop, so that no load of the loop
    # waits on another: its keys' and values' addresses come from registers (`tl.gather`), and the pipeliner
    # keeps STAGES - 1 blocks of keys and values in flight. (Read in the loop, an iteration ahead, each block's
    # ids were a trip to memory that the next block's loads waited on.) A window's keys may straddle one more
    # page than they fill
    W: tl.constexpr = WINDOW * BKV
    WP: tl.constexpr = 2 * ((W + PAGE_SIZE - 1) // PAGE_SIZE)
    for w0 in range(j_lo, j_hi, W):
        p0 = w0 // PAGE_SIZE
        pj = p0 + tl.arange(0, WP)
        ids = tl.load(pages + pj, mask=pj * PAGE_SIZE < j_hi, other=0)
        for j0 in tl.range(w0, tl.minimum(w0 + W, j_hi), BKV, num_stages=STAGES):
            j = j0 + tl.arange(0, BKV)
            page = tl.gather(ids, tl.minimum(j // PAGE_SIZE - p0, WP - 1), 0)
            slot = page.to(tl.int64) * PAGE_SIZE + j % PAGE_SIZE
            kv_mask = (j < j_hi)[:, None] & d_ok[None, :]
            k = tl.load(k_base + slot[:, None] * row_stride + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + slot[:, None] * row_stride + d[None, :], mask=kv_mask, other=0.0)
            m_i, l_i, acc = attend_block(q, k, v, j, j_hi, q_pos, m_i, l_i, acc, scale, DOT_F32, BF16_SCORES)
    return m_i, l_i, acc


@triton.jit
def attend_step(q, q_pos, j_lo, j_hi, kv, row0, k_col, v_col, scale, m_i, l_i, acc, BKV: tl.constexpr,
                DOT_F32: tl.constexpr, STAGES: tl.constexpr, BF16_SCORES: tl.constexpr):
    """The state after keys j_lo .. j_hi of the step's own rows: key j's at row row0 + j of the tensor
    descriptor kv, its key at column k_col and its value at v_col, a [BKV, HDP] block of each one bulk copy
    (no addresses, and no barrier for every thread's copies before the dots: ~20% faster than `attend_pages`
    alone, benchmarks/explore/prefill_attention.py)."""
    q_pos, j_hi = q_pos.to(tl.int32), j_hi.to(tl.int32)  # (j_lo: int32 already, as the loop's index must be)
    for j0 in tl.range(j_lo, j_hi, BKV, num_stages=STAGES):
        k = kv.load([row0 + j0, k_col])
        v = kv.load([row0 + j0, v_col])
        m_i, l_i, acc = attend_block(q, k, v, j0 + tl.arange(0, BKV), j_hi, q_pos, m_i, l_i, acc, scale, DOT_F32,
                                     BF16_SCORES)
    return m_i, l_i, acc


@triton.jit
def attention_task(desc, tile, ACT, F32, I32, KV, kv_plane, num_tokens, num_seqs, SEQ_STARTS: tl.constexpr,
                   CONTEXT_LENS: tl.constexpr, SEQ_REQ: tl.constexpr, REQ_PAGES: tl.constexpr,
                   PAGES_PER_SEQ: tl.constexpr, PAGE_SIZE: tl.constexpr, MAX_SEQS: tl.constexpr,
                   BM: tl.constexpr, BMP: tl.constexpr, BKV: tl.constexpr, DECODE_BKV: tl.constexpr,
                   HDP: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, MERGE_STAGES: tl.constexpr,
                   SPLITS: tl.constexpr, DECODE_WINDOW: tl.constexpr, PREFILL_WINDOW: tl.constexpr,
                   BF16_SCORES: tl.constexpr, EVEN_D: tl.constexpr):
    """Task (sequence, KV head, split) of the group's `num_tasks` (MAX_SEQS: the most sequences a step has,
    rounded up to a power of two). A sequence whose query rows (its tokens x the group's heads) fit BM
    decodes: the task takes its split of the context. Longer ones (prefill) come in blocks of BMP rows, and
    every task of the group shares the step's blocks, whichever sequence they belong to (the tasks of one
    sequence alone would leave most of the group idle when a step prefills a few of many sequences)."""
    H, HKV, splits, num_tasks = word(desc, 2), word(desc, 3), word(desc, 7), word(desc, 10)
    rep = H // HKV
    if word(desc, 11) == 2:
        merge_head(desc, tile, ACT, F32, I32, num_seqs, SEQ_STARTS, BM, HDP, MERGE_STAGES, SPLITS)
    else:
        group = tile // splits  # = sequence * HKV + kv head
        b = group // HKV
        if b < num_seqs:
            q_len = tl.load(I32 + SEQ_STARTS + b + 1) - tl.load(I32 + SEQ_STARTS + b)
            if q_len * rep <= BM:
                decode_rows(desc, b, group % HKV, tile % splits, ACT, F32, I32, KV, kv_plane, SEQ_STARTS,
                            CONTEXT_LENS, SEQ_REQ, REQ_PAGES, PAGES_PER_SEQ, PAGE_SIZE, BM, DECODE_BKV, HDP, DOT_F32,
                            STAGES, MERGE_STAGES, SPLITS, DECODE_WINDOW, BF16_SCORES, EVEN_D)
        if num_tokens > num_seqs:  # some sequence has more than one token: prefill blocks, numbered over the step
            seqs = tl.arange(0, MAX_SEQS)
            live = seqs < num_seqs
            starts = tl.load(I32 + SEQ_STARTS + seqs, mask=live, other=0)
            rows = (tl.load(I32 + SEQ_STARTS + seqs + 1, mask=live, other=0) - starts) * rep
            items = tl.where(rows > BM, tl.cdiv(rows, BMP), 0) * HKV  # (block, KV head) items per sequence
            ends = tl.cumsum(items, 0)
            total = tl.sum(items)
            # the step's keys and values, a row a token: one descriptor for all of a task's items, its rows past
            # a sequence's keys masked in `attend_block`, those past the step's read as zeros
            if STEP_KEYS:
                width = 2 * HKV * word8(desc, 4)
                kv = tl.make_tensor_descriptor(ACT + word8(desc, 12), shape=[tl.cast(num_tokens, tl.int32),
                                               tl.cast(width, tl.int32)], strides=[width, 1],
                                               block_shape=[BKV, HDP])
            else:
                kv = None
            # round r's items r * num_tasks ..: a task takes item `tile` of the even rounds and `num_tasks - 1 -
            # tile` of the odd ones, so that a task with a sequence's early (short, causal) blocks in one round
            # has late (long) ones in the next
            for r in range(0, tl.cdiv(total, num_tasks)):
                item = r * num_tasks + tl.where(r % 2 == 0, tile, num_tasks - 1 - tile)
                if item < total:
                    seq = tl.sum((ends <= item).to(tl.int32))
                    local = item - tl.sum(tl.where(seqs == seq, ends - items, 0))
                    prefill_rows(desc, seq, local % HKV, (local // HKV) * BMP, ACT, I32, KV, kv_plane, kv, SEQ_STARTS,
                                 CONTEXT_LENS, SEQ_REQ, REQ_PAGES, PAGES_PER_SEQ, PAGE_SIZE, BMP, BKV, HDP, DOT_F32,
                                 STAGES, PREFILL_WINDOW, BF16_SCORES, EVEN_D)


@triton.jit
def kv_head(desc, b, g, I32, KV, kv_plane, SEQ_STARTS: tl.constexpr, CONTEXT_LENS: tl.constexpr,
            SEQ_REQ: tl.constexpr, REQ_PAGES: tl.constexpr, PAGES_PER_SEQ: tl.constexpr):
    """Sequence b's first token, token count, context length and page table, and KV head g's K and V bases."""
    HD, layer = word8(desc, 4), word(desc, 5)
    start = tl.load(I32 + SEQ_STARTS + b)
    q_len = tl.load(I32 + SEQ_STARTS + b + 1) - start
    ctx = tl.load(I32 + CONTEXT_LENS + b)
    pages = I32 + REQ_PAGES + tl.load(I32 + SEQ_REQ + b) * PAGES_PER_SEQ
    # multiple_of on the products (a hint on the scalar argument itself does not reach them): rows then
    # load 16 bytes at a time instead of 2
    k_base = KV + tl.multiple_of((layer * 2) * kv_plane, 8) + g * HD
    v_base = KV + tl.multiple_of((layer * 2 + 1) * kv_plane, 8) + g * HD
    return start, q_len, ctx, pages, k_base, v_base


@triton.jit
def decode_rows(desc, b, g, split, ACT, F32, I32, KV, kv_plane, SEQ_STARTS: tl.constexpr,
                CONTEXT_LENS: tl.constexpr, SEQ_REQ: tl.constexpr, REQ_PAGES: tl.constexpr,
                PAGES_PER_SEQ: tl.constexpr, PAGE_SIZE: tl.constexpr, BM: tl.constexpr, BKV: tl.constexpr,
                HDP: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr, MERGE_STAGES: tl.constexpr,
                SPLITS: tl.constexpr, WINDOW: tl.constexpr, BF16_SCORES: tl.constexpr, EVEN_D: tl.constexpr):
    """Split `split` of sequence b's context for KV head g's query rows. Without a merge group the last split
    merges them all (SPLITS: at least `splits`, a power of two), a query row an iteration, MERGE_STAGES deep."""
    q_off, out_off, H, HKV = word8(desc, 0), word8(desc, 1), word(desc, 2), word(desc, 3)
    HD, scale = word8(desc, 4), word_f32(desc, 6)
    splits, part_off, ticket_off = word(desc, 7), word(desc, 8), word(desc, 9)
    dt: tl.constexpr = ACT.dtype.element_ty
    start, q_len, ctx, pages, k_base, v_base = kv_head(desc, b, g, I32, KV, kv_plane, SEQ_STARTS, CONTEXT_LENS,
                                                       SEQ_REQ, REQ_PAGES, PAGES_PER_SEQ)
    rep = H // HKV
    d = tl.arange(0, HDP)
    d_ok = (d < HD) | EVEN_D  # (EVEN_D: every head fills HDP, so no load or store needs the mask)
    r = tl.arange(0, BM)
    r_ok = r < q_len * rep
    tok, head, q_pos = start + r // rep, g * rep + r % rep, ctx - q_len + r // rep
    q = tl.load(ACT + q_off + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :],
                mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    chunk = tl.cdiv(tl.cdiv(ctx, splits), BKV) * BKV
    m_i, l_i, acc = attend(q, q_pos, (split * chunk).to(tl.int32), tl.minimum(ctx, (split + 1) * chunk), pages,
                           k_base, v_base, HKV * HD, d, d_ok, scale, PAGE_SIZE, BKV, DOT_F32, STAGES, WINDOW,
                           BF16_SCORES)
    out_ptr = ACT + out_off + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
    if splits == 1:
        tl.store(out_ptr, (acc / l_i[:, None]).to(dt), mask=r_ok[:, None] & d_ok[None, :])
    else:
        group = b * HKV + g
        # the group's partials: 16-float aligned (the region is, and so is a partial's size), which lets the
        # stores and the merge's loads move 16 bytes a thread instead of 4
        part = F32 + tl.multiple_of(part_off + group * splits * (BM * (HDP + 2)), 16)
        _store_part(part + split * (BM * (HDP + 2)), m_i, l_i, acc, r_ok, BM, HDP)
        if word(desc, 11) == 0:  # (1: merged by the group after this one)
            if arrives_last(F32 + ticket_off + group, splits):
                _merge_parts(part, splits, q_len * rep, ACT + out_off + start * (H * HD) + g * rep * HD, rep,
                             H * HD, HD, d, d_ok, BM, HDP, MERGE_STAGES, SPLITS)


@triton.jit
def prefill_rows(desc, b, g, m0, ACT, I32, KV, kv_plane, kv, SEQ_STARTS: tl.constexpr, CONTEXT_LENS: tl.constexpr,
                 SEQ_REQ: tl.constexpr, REQ_PAGES: tl.constexpr, PAGES_PER_SEQ: tl.constexpr,
                 PAGE_SIZE: tl.constexpr, BMP: tl.constexpr, BKV: tl.constexpr, HDP: tl.constexpr,
                 DOT_F32: tl.constexpr, STAGES: tl.constexpr, WINDOW: tl.constexpr, BF16_SCORES: tl.constexpr,
                 EVEN_D: tl.constexpr):
    """Query rows m0 .. m0 + BMP of sequence b and KV head g, causal: no key after the block's last token.
    STEP_KEYS: the keys of earlier steps from the pages, and this step's through kv, the descriptor of the rows
    the QKV epilogue also wrote them to (`attend_step`); else every key from the pages."""
    q_off, out_off, H, HKV = word8(desc, 0), word8(desc, 1), word(desc, 2), word(desc, 3)
    HD, scale = word8(desc, 4), word_f32(desc, 6)
    dt: tl.constexpr = ACT.dtype.element_ty
    start, q_len, ctx, pages, k_base, v_base = kv_head(desc, b, g, I32, KV, kv_plane, SEQ_STARTS, CONTEXT_LENS,
                                                       SEQ_REQ, REQ_PAGES, PAGES_PER_SEQ)
    rep = H // HKV
    d = tl.arange(0, HDP)
    d_ok = (d < HD) | EVEN_D  # (EVEN_D: every head fills HDP, so no load or store needs the mask)
    r = m0 + tl.arange(0, BMP)
    r_ok = r < q_len * rep
    tok, head, q_pos = start + r // rep, g * rep + r % rep, ctx - q_len + r // rep
    q_ptr = ACT + q_off + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
    q = tl.load(q_ptr, mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    last = tl.minimum(ctx, ctx - q_len + (m0 + BMP - 1) // rep + 1)
    m_i, l_i, acc = attention_start(q)
    if STEP_KEYS:
        prior = ctx - q_len  # keys of earlier steps
        m_i, l_i, acc = attend_pages(q, q_pos, 0, prior, pages, k_base, v_base, HKV * HD, d, d_ok, scale, m_i, l_i,
                                     acc, PAGE_SIZE, BKV, DOT_F32, STAGES, WINDOW, BF16_SCORES)
        m_i, l_i, acc = attend_step(q, q_pos, prior, last, kv, (start - prior).to(tl.int32),
                                    (g * HD).to(tl.int32), ((HKV + g) * HD).to(tl.int32), scale, m_i, l_i, acc, BKV,
                                    DOT_F32, STAGES, BF16_SCORES)
    else:
        m_i, l_i, acc = attend_pages(q, q_pos, 0, last, pages, k_base, v_base, HKV * HD, d, d_ok, scale, m_i, l_i,
                                     acc, PAGE_SIZE, BKV, DOT_F32, STAGES, WINDOW, BF16_SCORES)
    out_ptr = ACT + out_off + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :]
    tl.store(out_ptr, (acc / l_i[:, None]).to(dt), mask=r_ok[:, None] & d_ok[None, :])


@triton.jit
def _store_part(part, m_i, l_i, acc, r_ok, BM: tl.constexpr, HDP: tl.constexpr):
    """A split's running max, sum (BM each) and unnormalised output (BM x HDP; the query rows alone)."""
    rows = tl.arange(0, BM)
    tl.store(part + rows, m_i)
    tl.store(part + BM + rows, l_i)
    tl.store(part + 2 * BM + rows[:, None] * HDP + tl.arange(0, HDP)[None, :], acc, mask=r_ok[:, None])


@triton.jit
def merge_head(desc, tile, ACT, F32, I32, num_seqs, SEQ_STARTS: tl.constexpr, BM: tl.constexpr, HDP: tl.constexpr,
               STAGES: tl.constexpr, SPLITS: tl.constexpr):
    """Task (sequence b, query head h) of the group after a decode step's splits: merges the partials of
    h's rows (one a token) into the attention output."""
    out_off, H, HKV, HD = word8(desc, 1), word(desc, 2), word(desc, 3), word8(desc, 4)
    splits, part_off = word(desc, 7), word(desc, 8)
    b, h = tile // H, tile % H
    if b < num_seqs:
        start = tl.load(I32 + SEQ_STARTS + b)
        q_len = tl.load(I32 + SEQ_STARTS + b + 1) - start
        rep = H // HKV
        if q_len * rep <= BM:  # the splits decoded it (a longer sequence prefilled)
            d = tl.arange(0, HDP)
            part = F32 + tl.multiple_of(part_off + (b * HKV + h // rep) * splits * (BM * (HDP + 2)), 16)
            out = ACT + out_off + start * (H * HD) + h * HD
            for t in tl.range(0, q_len, num_stages=STAGES):
                _merge_row(part, splits, t * rep + h % rep, out + t * (H * HD), d, d < HD, BM, HDP, SPLITS)


@triton.jit
def _merge_row(part, splits, r, out, d, d_ok, BM: tl.constexpr, HDP: tl.constexpr, SPLITS: tl.constexpr):
    """Query row r of the splits' partials at `part`, merged and stored at out (see `_merge_parts`)."""
    size = BM * (HDP + 2)
    s = tl.arange(0, SPLITS)
    s_ok = s < splits
    m_s = tl.load(part + s * size + r, mask=s_ok, other=NEG)
    l_s = tl.load(part + s * size + BM + r, mask=s_ok, other=0.0)
    acc_s = tl.load(part + s[:, None] * size + 2 * BM + r * HDP + tl.arange(0, HDP)[None, :], mask=s_ok[:, None],
                    other=0.0)
    weight = tl.exp(m_s - tl.max(m_s, 0))
    row = tl.sum(acc_s * weight[:, None], 0) / tl.sum(l_s * weight, 0)
    tl.store(out + d, row.to(out.dtype.element_ty), mask=d_ok)


@triton.jit
def _merge_parts(part, splits, num_rows, out, rep, token_stride, HD, d, d_ok, BM: tl.constexpr, HDP: tl.constexpr,
                 STAGES: tl.constexpr, SPLITS: tl.constexpr):
    """Merges the splits' partial softmaxes of each of the group's num_rows query rows (row r: token r // rep,
    head r % rep of the group, stored at out): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M the
    largest m_s. Every split of a row comes in one load (a pass over the splits with a running maximum took
    a trip to memory a split)."""
    for r in tl.range(0, num_rows, num_stages=STAGES):
        _merge_row(part, splits, r, out + (r // rep) * token_stride + (r % rep) * HD, d, d_ok, BM, HDP, SPLITS)
