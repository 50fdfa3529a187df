"""Attention in a step that prefills, in Gluon: every sequence's query rows against its paged keys, causal.

It computes what an ATTENTION group's Triton tasks and its merge group compute in a step where some sequence has more
than one token (codegen/bodies/attention.py, `prefill_rows`, and `decode_rows` with the merge for the others), from
the same descriptor row (`ATTENTION_FIELDS`) and the step's plan (each sequence's first token, context length and
request, each request's pages): a sequence's query rows are its tokens x the query heads of a KV head (row r: token
r // REP, head r % REP of the group), and row r sees the keys up to its token's position. Every sequence, decoding or
prefilling, comes in items of BM rows (16 a consumer warp: 128 with `LAUNCH`, 64 with `DECODE_LAUNCH` for a step
that only decodes) and one KV head, handed out as the Triton tasks hand out prefill blocks
(round r's items r P .., program p taking item p of even rounds and P - 1 - p of odd ones, so that each has long and
short causal blocks alike); its outputs are final, so the merge group has nothing to do. A step that only decodes and
whose (sequence, KV head) pairs are fewer than the programs (`SPLIT`) gives each pair S items, each a share of its
keys: every item stores its partial softmax (max, sum, unnormalised rows, laid out as the Triton body's) and takes the
pair's ticket, and the last to arrive merges them (as `_merge_parts`).

One program an SM (`ws_prefill_attention.py`'s structure, session 59): a loader warp reads IDS of a sequence's page ids
in one load and copies each page's keys and values as TMA boxes (two column halves of 64, a 128-byte swizzle's
width) into a ring of STAGES slots of BLOCK keys, running ahead across items; two consumer warp groups fold each
slot into the online softmax on `wgmma` (scores q k^T over the halves, the output halves += p v), the causal and
length masks only on the blocks that need them. Scores stay fp32 with the scale in the exponent, as the Triton body
without `attention_bf16_scores`. Heads of 128 dimensions.

H200, Llama-3-8B in the host-driven executor (`benchmarks/gluon_groups.py`, session 61, 32 layers, against the Triton
tasks and their merge group): the first step of 2,048 tokens 3,390 us against 5,686 (1.68x), of 512 tokens 653
against 1,079 (1.65x), after q's loads and the outputs' stores took 4 bytes a thread instead of 2 (3,979 and 747
before); a decode step of 64 sequences at context 512 on 4 consumer warps (before that change) 1,524 against 1,696.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from codegen.bodies.attention import ATTENTION_FIELDS
from codegen.gluon.events import wait
from codegen.gluon.linear import ALIGN, LAUNCH, LOADER_REGS, _region
from codegen.tasks import DESC_WORDS

USED = ("q_off", "out_off", "num_heads", "num_kv_heads", "head_dim", "layer", "scale", "merger", "splits",
        "part_off", "ticket_off")
WORDS = gl.constexpr(tuple(ATTENTION_FIELDS.index(f) for f in USED))
HEAD_DIM = 128
BLOCK, STAGES, IDS = 64, 3, 32  # keys a slot, slots in the ring, page ids the loader reads at once
LOG2E = gl.constexpr(1.4426950408889634)
NEG = gl.constexpr(-1.0e30)

# a step that only decodes: a sequence's query rows are a few (its token x the KV head's query heads), so items of
# 64 rows on one consumer warp group (wgmma's least M) rather than 128 on two
DECODE_LAUNCH = dict(num_warps=4, maxnreg=65536 // ((4 + 4) * 32) // 8 * 8)

SIGNATURE = {"DESCS": "*i64", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "KV": "*bf16", "kv_plane": "i64", "kv_rows": "i32",
             "desc_index": "i32", "control_at": "i32", "seq_starts_at": "i32", "context_lens_at": "i32",
             "seq_req_at": "i32", "req_pages_at": "i32"}


@gluon.constexpr_function
def _seq_lanes(max_seqs, num_warps):
    """The consumers' layout of a step's sequences (`_step_items`): all of them in each warp (two a lane for 64), the
    warps alike, so that an item's reductions over them stay in the warp. Spread over the warps, each reduction of
    `_item_words` went through shared memory behind two or three barriers (the words of one item ahead timed twice:
    +1.2-1.4 us a b64 step's attention layer; kept in the warp, attention 42.4-42.6 -> 41.0-41.7 us, the 160 groups
    5,471-5,485 -> 5,413-5,424, H200, session 81)."""
    return gl.BlockedLayout([max(int(max_seqs) // 32, 1)], [32], [int(num_warps)], [0])


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _splits(I32, control_at, context_lens_at, HKV, splits, BLOCK_: gl.constexpr, MAX_SEQS: gl.constexpr,
            SPLIT: gl.constexpr, layout: gl.constexpr):
    """Each (sequence, KV head)'s splits of its context in this step: with SPLIT (a step that only decodes, whose
    pairs are fewer than the programs) as many as give every program one at most, no more than the descriptor's
    `splits` (its scratch holds those), nor than give a split of the longest context fewer than SPLIT slots of BLOCK
    keys (a split of fewer keys still takes a slot, and each split adds a partial to merge); else 1."""
    if SPLIT:
        num_seqs = gl.load(I32 + control_at + 1)
        pairs = gl.maximum(num_seqs * HKV, 1)
        lanes = gl.arange(0, MAX_SEQS, layout=layout)
        longest = gl.max(gl.load(I32 + context_lens_at + lanes, mask=lanes < num_seqs, other=0), axis=0)
        return gl.maximum(gl.minimum(gl.minimum(splits, gl.num_programs(0) // pairs),
                                     gl.cdiv(longest, BLOCK_ * SPLIT)), 1)
    else:
        return gl.to_tensor(1)


@gluon.jit
def _step_items(I32, control_at, seq_starts_at, REP, BM: gl.constexpr, HKV, S, MAX_SEQS: gl.constexpr,
                layout: gl.constexpr):
    """The step's items: (each sequence's number of them, their running total, the total), over MAX_SEQS lanes. An
    item: BM query rows of a sequence, a KV head and one of S splits of the keys."""
    num_seqs = gl.load(I32 + control_at + 1)
    seqs = gl.arange(0, MAX_SEQS, layout=layout)
    live = seqs < num_seqs
    starts = gl.load(I32 + seq_starts_at + seqs, mask=live, other=0)
    rows = (gl.load(I32 + seq_starts_at + seqs + 1, mask=live, other=0) - starts) * REP
    items = gl.cdiv(rows, BM) * HKV * S
    ends = gl.associative_scan(items, 0, _add)
    return seqs, items, ends, gl.sum(items, axis=0)


@gluon.jit
def _item(r, seqs, items, ends, total, I32, seq_starts_at, context_lens_at, seq_req_at, req_pages_at, REP, HKV, S,
          BM: gl.constexpr, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr):
    """Round r's item of this program: (valid, sequence, its first token, its tokens, context, page table, KV head,
    split, the item's first query row, its first key and the end of its keys). Split s of S takes the s-th of S
    page-aligned shares of the keys the item's rows see."""
    valid, seq, g, split, m0, start, end, ctx, req = _item_words(r, seqs, items, ends, total, I32, seq_starts_at,
                                                                 context_lens_at, seq_req_at, HKV, S, BM)
    pages, first_key, last = _item_keys(split, m0, start, end, ctx, req, I32, req_pages_at, REP, S, BM, PAGE,
                                        PAGES_PER_SEQ)
    return valid, seq, start, end - start, ctx, pages, g, split, m0, first_key, last


@gluon.jit
def _item_words(r, seqs, items, ends, total, I32, seq_starts_at, context_lens_at, seq_req_at, HKV, S,
                BM: gl.constexpr):
    """`_item`'s words as read: (valid, sequence, KV head, split, first query row; the sequence's first token, the
    token after its last, its context and its request, loaded). Nothing here waits for the loads: a loop that reads
    an item ahead carries them untouched until they have come (`load_items`)."""
    P = gl.num_programs(0)
    pid = gl.program_id(0)
    item = r * P + gl.where(r % 2 == 0, pid, P - 1 - pid)
    seq = gl.sum((ends <= item).to(gl.int32), axis=0)
    local = item - gl.sum(gl.where(seqs == seq, ends - items, 0), axis=0)
    by_split = local // S
    by_head = by_split // HKV
    valid = item < total
    seq = gl.where(valid, seq, 0)
    return valid, seq, by_split - by_head * HKV, local - by_split * S, by_head * BM, \
        gl.load(I32 + seq_starts_at + seq), gl.load(I32 + seq_starts_at + seq + 1), \
        gl.load(I32 + context_lens_at + seq), gl.load(I32 + seq_req_at + seq)


@gluon.jit
def _item_keys(split, m0, start, end, ctx, req, I32, req_pages_at, REP, S, BM: gl.constexpr, PAGE: gl.constexpr,
               PAGES_PER_SEQ: gl.constexpr):
    """An item's page table, first key and end of its keys, from its words (`_item_words`)."""
    pages = I32 + req_pages_at + req * PAGES_PER_SEQ
    seen = gl.minimum(ctx, ctx - (end - start) + (m0 + BM - 1) // REP + 1)
    share = gl.cdiv(gl.cdiv(seen, S), PAGE) * PAGE
    first_key = split * share
    return pages, first_key, gl.minimum(seen, first_key + share)


@gluon.jit
def _store_rows(ACT, out_off, start, orows, num_rows, g, REP, H, o0, o1, l, HD: gl.constexpr):
    """An item's output rows below num_rows (row r: token r // REP, head r % REP of KV head g's query heads)."""
    HW: gl.constexpr = HD // 2
    od = gl.arange(0, HW, layout=gl.SliceLayout(0, o0.type.layout))
    out = ACT + _region(out_off) + ((start + orows // REP).to(gl.int64) * H)[:, None] * HD + \
        ((g * REP + orows % REP) * HD)[:, None] + od[None, :]
    ok = (orows < num_rows)[:, None]
    lo = gl.convert_layout(l, gl.SliceLayout(1, o0.type.layout))[:, None]
    gl.store(out, (o0 / lo).to(gl.bfloat16), mask=ok)
    gl.store(out + HW, (o1 / lo).to(gl.bfloat16), mask=ok)


@gluon.jit
def _store_part(part, m, l, o0, o1, orows, num_rows, PART_ROWS: gl.constexpr, HD: gl.constexpr):
    """A split's partial softmax of the item's rows below num_rows (at most PART_ROWS): running max in the merge's
    units, sum, and unnormalised output halves, as the Triton body's `_store_part` lays them out."""
    HW: gl.constexpr = HD // 2
    sr = gl.convert_layout(orows, m.type.layout)
    gl.store(part + sr, m, mask=sr < num_rows)
    gl.store(part + PART_ROWS + sr, l, mask=sr < num_rows)
    od = gl.arange(0, HW, layout=gl.SliceLayout(0, o0.type.layout))
    acc = part + 2 * PART_ROWS + orows[:, None] * HD + od[None, :]
    ok = (orows < num_rows)[:, None]
    gl.store(acc, o0, mask=ok)
    gl.store(acc + HW, o1, mask=ok)


@gluon.jit
def _merge_parts(part, S, num_rows, out, REP, H, PART_ROWS: gl.constexpr, HD: gl.constexpr,
                 MAX_SPLITS: gl.constexpr):
    """The S splits' partials at `part` of each of num_rows query rows (row r: token r // REP, head r % REP of the
    group, out its first), merged as the Triton body's `_merge_row`: sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M),
    M the largest m_s. Read past L1: other programs wrote them."""
    tile: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
    sp = gl.arange(0, MAX_SPLITS, layout=gl.SliceLayout(1, tile))
    d = gl.arange(0, HD, layout=gl.SliceLayout(0, tile))
    # a row's loads go out before the row before is stored (the compiler may not move them past the stores): one
    # trip to L2 for the rows rather than one a row (the merge was most of a one-row step's attention, session 65)
    m_s, l_s, acc_s = _part_row(part, 0, S, sp, d, PART_ROWS, HD)
    for r in range(0, num_rows):
        m_next, l_next, acc_next = _part_row(part, r + 1, gl.where(r + 1 < num_rows, S, 0), sp, d, PART_ROWS, HD)
        weight = gl.exp(m_s - gl.max(m_s, axis=0))
        row = gl.sum(acc_s * weight[:, None], axis=0) / gl.sum(l_s * weight, axis=0)
        gl.store(out + ((r // REP).to(gl.int64) * H) * HD + (r % REP) * HD + d, row.to(gl.bfloat16))
        m_s, l_s, acc_s = m_next, l_next, acc_next


@gluon.jit
def _merge_if_last(ACT, F32, out_off, part_off, ticket_off, group, S, start, num_rows, g, REP, H,
                   PART_ROWS: gl.constexpr, HD: gl.constexpr, MAX_SPLITS: gl.constexpr):
    """A split's partial stored: the pair's ticket taken, and the last of its S splits to arrive merges their
    partials into the outputs (`_merge_parts`) and zeroes the ticket for the next layer's step."""
    gl.thread_barrier()  # every thread's partial stored before the ticket publishes it
    arrived = gl.atomic_add(F32 + ticket_off + group, 1.0, sem="acq_rel")  # (`arrives_last`)
    gl.thread_barrier()
    if arrived == S - 1:
        gl.store(F32 + ticket_off + group, 0.0)
        _merge_parts(F32 + _region(part_off) + group * S * (PART_ROWS * (HD + 2)), S, num_rows,
                     ACT + _region(out_off) + (start.to(gl.int64) * H + g * REP) * HD, REP, H, PART_ROWS, HD,
                     MAX_SPLITS)


@gluon.jit
def _part_row(part, r, S, sp, d, PART_ROWS: gl.constexpr, HD: gl.constexpr):
    """Row r of the S splits' partials at `part` (none where S is 0): their maxima, sums and unnormalised rows."""
    size = PART_ROWS * (HD + 2)
    s_ok = sp < S
    m_s = gl.load(part + sp * size + r, mask=s_ok, other=NEG, cache_modifier=".cg")
    l_s = gl.load(part + sp * size + PART_ROWS + r, mask=s_ok, other=0.0, cache_modifier=".cg")
    acc_s = gl.load(part + (sp * size + 2 * PART_ROWS + r * HD)[:, None] + d[None, :], mask=s_ok[:, None], other=0.0,
                    cache_modifier=".cg")
    return m_s, l_s, acc_s


@gluon.jit
def _loader(KV, kv_plane, kv_rows, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at,
            seq_req_at, req_pages_at, layer, REP, HKV, HD: gl.constexpr, BM: gl.constexpr, PAGE: gl.constexpr,
            PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, STAGES_: gl.constexpr, IDS_: gl.constexpr,
            splits, SPLIT: gl.constexpr):
    i = 0  # (a tensor, as the slot count the loop carries)
    load_items(KV, kv_plane, kv_rows, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at,
               seq_req_at, req_pages_at, layer, REP, HKV, splits, i, HD, BM, PAGE, PAGES_PER_SEQ, MAX_SEQS, STAGES_,
               IDS_, SPLIT)


@gluon.jit
def load_items(KV, kv_plane, kv_rows, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at,
               seq_req_at, req_pages_at, layer, REP, HKV, splits, i, HD: gl.constexpr, BM: gl.constexpr,
               PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr, STAGES_: gl.constexpr,
               IDS_: gl.constexpr, SPLIT: gl.constexpr, KS: gl.constexpr = 2, V_OFF: gl.constexpr = 0, EVENTS=None,
               event=0, PROBE: gl.constexpr = 0):
    """Every item's keys and values into ring slots i .., a slot of BLOCK keys at a time (each page's two column
    halves of each); returns the slot after them. Slot s's halves: k_ring's KS s, KS s + 1 and v_ring's KS s + V_OFF,
    KS s + V_OFF + 1 (KS 4, V_OFF 2: both in one array). EVENTS: a persistent kernel's group (`chain.py`), whose
    keys before the step's own are in the cache already: an item waits for EVENTS[event - 1] to reach the programs'
    count only before the slots that hold keys the step writes (the group before's QKV). PROBE (`batch.batch_chain`'s,
    timing only) & 64: the pool read as if a page's KV heads were laid out one after the other, each box's [PAGE, HW]
    2 KB contiguous where the real layout's reads HW x 2 bytes of each of PAGE rows HKV HD x 2 bytes apart."""
    BLOCK_: gl.constexpr = k_ring.type.shape[1]
    HW: gl.constexpr = HD // 2
    PER: gl.constexpr = BLOCK_ // PAGE  # pages a slot
    one: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    # the pool as rows of a token's every KV head: plane (layer, k or v) at row plane * kv_plane / (HKV HD)
    pool = tma.make_tensor_descriptor(KV, [kv_rows, HKV * HD], [HKV * HD, 1], [PAGE, HW], k_ring.type.layout)
    if PROBE & 64:  # (a token row's 2 HKV column halves as rows of their own)
        pool = tma.make_tensor_descriptor(KV, [kv_rows * 2 * HKV, HW], [HW, 1], [PAGE, HW], k_ring.type.layout)
    plane_rows = (kv_plane // (HKV * HD)).to(gl.int32)
    k_row0 = layer * 2 * plane_rows
    S = _splits(I32, control_at, context_lens_at, HKV, splits, BLOCK_, MAX_SEQS, SPLIT, one)
    seqs, items, ends, total = _step_items(I32, control_at, seq_starts_at, REP, BM, HKV, S, MAX_SEQS, one)
    # an item's words are read two items ahead, its first page ids one ahead and a chunk's next ids a chunk ahead,
    # each left untouched until then: read where they were used, each was a trip to L2 that held the item's copies
    # back while the ring ran dry
    valid, _, g, split, m0, start, end, ctx, req = _item_words(0, seqs, items, ends, total, I32, seq_starts_at,
                                                               context_lens_at, seq_req_at, HKV, S, BM)
    pages, first_key, last = _item_keys(split, m0, start, end, ctx, req, I32, req_pages_at, REP, S, BM, PAGE,
                                        PAGES_PER_SEQ)
    ids = _page_ids(pages, first_key // PAGE, last, valid, PAGE, IDS_, one)
    n_valid, _, n_g, n_split, n_m0, n_start, n_end, n_ctx, n_req = _item_words(1, seqs, items, ends, total, I32,
                                                                               seq_starts_at, context_lens_at,
                                                                               seq_req_at, HKV, S, BM)
    waited = gl.to_tensor(0)  # (a group's event, once seen, is seen)
    for r in range(gl.cdiv(total, gl.num_programs(0))):
        n_pages, n_first, n_last = _item_keys(n_split, n_m0, n_start, n_end, n_ctx, n_req, I32, req_pages_at, REP, S,
                                              BM, PAGE, PAGES_PER_SEQ)
        n_ids = _page_ids(n_pages, n_first // PAGE, n_last, n_valid, PAGE, IDS_, one)
        a_valid, _, a_g, a_split, a_m0, a_start, a_end, a_ctx, a_req = _item_words(r + 2, seqs, items, ends, total,
                                                                                   I32, seq_starts_at,
                                                                                   context_lens_at, seq_req_at, HKV,
                                                                                   S, BM)
        if valid:
            old = ctx - (end - start)  # (keys before the step's own: in the cache already)
            num_pages = gl.cdiv(last, PAGE)
            for w0 in range(first_key // PAGE, num_pages, IDS_):  # IDS page ids in one load, then their copies
                more = _page_ids(pages, w0 + IDS_, last, valid, PAGE, IDS_, one)
                pw = w0 + gl.arange(0, IDS_, layout=one)
                for p0 in range(w0, gl.minimum(w0 + IDS_, num_pages), PER):
                    if EVENTS is not None:  # (pages past `last` are zeros: out of the pool's bounds, no reads)
                        if ((p0 + PER) * PAGE > old) & (waited == 0):
                            wait(EVENTS, event - 1, gl.num_programs(0))
                            waited += 1
                    s = i % STAGES_
                    mbarrier.wait(empty.index(s), ((i // STAGES_) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), 2 * BLOCK_ * HD * 2)  # (a constant count: the zeros count)
                    for q in gl.static_range(PER):
                        row = gl.where(p0 + q < num_pages, gl.sum(gl.where(pw == p0 + q, ids, 0), axis=0) * PAGE,
                                       kv_rows)
                        for h in gl.static_range(2):
                            k_at, v_at = [k_row0 + row, g * HD + h * HW], [k_row0 + plane_rows + row, g * HD + h * HW]
                            if PROBE & 64:
                                k_at = [(k_row0 + row) * 2 * HKV + (2 * g + h) * PAGE, 0]
                                v_at = [(k_row0 + plane_rows + row) * 2 * HKV + (2 * g + h) * PAGE, 0]
                            tma.async_copy_global_to_shared(pool, k_at, ready.index(s),
                                                            k_ring.index(KS * s + h).slice(q * PAGE, PAGE, dim=0))
                            tma.async_copy_global_to_shared(pool, v_at, ready.index(s),
                                                            v_ring.index(KS * s + V_OFF + h).slice(q * PAGE, PAGE,
                                                                                                   dim=0))
                    i += 1
                ids = more
        valid, g, start, end, ctx, pages, first_key, last, ids = n_valid, n_g, n_start, n_end, n_ctx, n_pages, \
            n_first, n_last, n_ids
        n_valid, n_g, n_split, n_m0, n_start, n_end, n_ctx, n_req = a_valid, a_g, a_split, a_m0, a_start, a_end, \
            a_ctx, a_req
    return i


@gluon.jit
def _page_ids(pages, first, last, valid, PAGE: gl.constexpr, IDS_: gl.constexpr, layout: gl.constexpr):
    """Page ids first .. first + IDS_ of a page table whose keys end at `last` (0 past them, or for an item not
    valid: no reads)."""
    pw = first + gl.arange(0, IDS_, layout=layout)
    return gl.load(pages + pw, mask=(pw < gl.cdiv(last, PAGE)) & valid, other=0)


@gluon.jit
def _consumer(ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at, seq_req_at,
              req_pages_at, q_off, out_off, H, HKV, scale, splits, part_off, ticket_off, HD: gl.constexpr,
              BM: gl.constexpr, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr,
              STAGES_: gl.constexpr, SPLIT: gl.constexpr, PART_ROWS: gl.constexpr, MAX_SPLITS: gl.constexpr):
    i = 0  # (a tensor, as the slot count the loop carries)
    consume_items(ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at, seq_req_at,
                  req_pages_at, q_off, out_off, H, HKV, scale, splits, part_off, ticket_off, i, HD, BM, PAGE,
                  PAGES_PER_SEQ, MAX_SEQS, STAGES_, SPLIT, PART_ROWS, MAX_SPLITS)


@gluon.jit
def consume_items(ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at, seq_req_at,
                  req_pages_at, q_off, out_off, H, HKV, scale, splits, part_off, ticket_off, i, HD: gl.constexpr,
                  BM: gl.constexpr, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr, MAX_SEQS: gl.constexpr,
                  STAGES_: gl.constexpr, SPLIT: gl.constexpr, PART_ROWS: gl.constexpr, MAX_SPLITS: gl.constexpr,
                  KS: gl.constexpr = 2, V_OFF: gl.constexpr = 0, EVENTS=None, event=0, PROBE: gl.constexpr = 0):
    """Every item's online softmax over its keys from ring slot i on, then its outputs (or its split's partial and,
    last to arrive, the merge); returns the slot after them. KS, V_OFF: where a slot's halves are (`load_items`).
    EVENTS: an item's queries are read once EVENTS[event - 1] reaches the programs' count (as `load_items`). PROBE
    (`batch.batch_chain`'s, timing only) & 32: no products, each slot released once it is full."""
    BLOCK_: gl.constexpr = k_ring.type.shape[1]
    HW: gl.constexpr = HD // 2
    REP = H // HKV
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, BLOCK_, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, HW, 16])
    q_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    lanes: gl.constexpr = _seq_lanes(MAX_SEQS, gl.num_warps())
    qr = gl.arange(0, BM, layout=gl.SliceLayout(1, q_dot))
    qd = gl.arange(0, HW, layout=gl.SliceLayout(0, q_dot))
    keys = gl.arange(0, BLOCK_, layout=gl.SliceLayout(0, s_layout))
    sr = gl.arange(0, BM, layout=rows_s)
    orow = gl.arange(0, BM, layout=rows_o)
    c = scale * LOG2E  # exp(scale (s - m)) as 2^(s c - m c), as the Triton body's
    S = _splits(I32, control_at, context_lens_at, HKV, splits, BLOCK_, MAX_SEQS, SPLIT, lanes)
    seqs, items, ends, total = _step_items(I32, control_at, seq_starts_at, REP, BM, HKV, S, MAX_SEQS, lanes)
    waited = gl.to_tensor(0)  # (the group's event, once seen, is seen: each look a trip to L2 before the queries)
    for r in range(gl.cdiv(total, gl.num_programs(0))):
        valid, seq, start, q_len, ctx, _, g, split, m0, first_key, last = _item(
            r, seqs, items, ends, total, I32, seq_starts_at, context_lens_at, seq_req_at, req_pages_at, REP, HKV, S,
            BM, PAGE, PAGES_PER_SEQ)
        if valid:
            if EVENTS is not None:
                if waited == 0:
                    wait(EVENTS, event - 1, gl.num_programs(0))
                    waited += 1
            rows = m0 + qr
            q_rows = ACT + _region(q_off) + ((start + rows // REP).to(gl.int64) * H)[:, None] * HD + \
                ((g * REP + rows % REP) * HD)[:, None] + qd[None, :]
            q_ok = (rows < q_len * REP)[:, None]
            q0 = gl.load(q_rows, mask=q_ok, other=0.0)
            q1 = gl.load(q_rows + HW, mask=q_ok, other=0.0)
            first = ctx - q_len + m0 // REP  # the item's first row's position: keys past it need the causal mask
            q_pos = ctx - q_len + (m0 + sr) // REP
            m = gl.full([BM], NEG, gl.float32, rows_s)
            l = gl.zeros([BM], gl.float32, rows_s)
            o0 = gl.zeros([BM, HW], gl.float32, o_layout)
            o1 = gl.zeros([BM, HW], gl.float32, o_layout)
            for j in range(first_key, last, BLOCK_):
                s = i % STAGES_
                mbarrier.wait(ready.index(s), (i // STAGES_) & 1)
                if not PROBE & 32:  # (timing only: with it, no products, each slot released once full)
                    sc = warpgroup_mma(q0, k_ring.index(KS * s).permute((1, 0)),
                                       gl.zeros([BM, BLOCK_], gl.float32, s_layout), is_async=True)
                    sc = warpgroup_mma(q1, k_ring.index(KS * s + 1).permute((1, 0)), sc, is_async=True)
                    sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
                    if (j + BLOCK_ - 1 > first) | (j + BLOCK_ > last):
                        key = j + keys
                        sc = gl.where((key[None, :] <= q_pos[:, None]) & (key < last)[None, :], sc, NEG)
                    m_new = gl.maximum(m, gl.max(sc, axis=1))
                    p = gl.exp2(sc * c - (m_new * c)[:, None])
                    alpha = gl.exp2((m - m_new) * c)
                    l = l * alpha + gl.sum(p, axis=1)
                    m = m_new
                    a = gl.convert_layout(alpha, rows_o)[:, None]
                    pb = gl.convert_layout(p.to(gl.bfloat16), p_dot)
                    o0 = warpgroup_mma(pb, v_ring.index(KS * s + V_OFF), o0 * a, is_async=True)
                    o1 = warpgroup_mma(pb, v_ring.index(KS * s + V_OFF + 1), o1 * a, is_async=True)
                    o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
                fence_async_shared()  # the slot's reads before the loader's next copies into it
                mbarrier.arrive(empty.index(s), count=1)
                i += 1
            orows = m0 + orow
            num_rows = q_len * REP
            if SPLIT:
                if S > 1:  # this split's partial, and the last split of the pair to arrive merges them
                    group = seq * HKV + g
                    _store_part(F32 + _region(part_off) + (group * S + split) * (PART_ROWS * (HD + 2)), m * scale, l,
                                o0, o1, orows, num_rows, PART_ROWS, HD)
                    _merge_if_last(ACT, F32, out_off, part_off, ticket_off, group, S, start, num_rows, g, REP, H,
                                   PART_ROWS, HD, MAX_SPLITS)
                else:
                    _store_rows(ACT, out_off, start, orows, num_rows, g, REP, H, o0, o1, l, HD)
            else:
                _store_rows(ACT, out_off, start, orows, num_rows, g, REP, H, o0, o1, l, HD)
    return i


@gluon.jit
def consume_decode_items(ACT, F32, I32, k_ring, v_ring, ready, empty, qp, control_at, seq_starts_at, context_lens_at,
                         seq_req_at, req_pages_at, q_off, out_off, H, HKV, scale, splits, part_off, ticket_off, i,
                         HD: gl.constexpr, BM: gl.constexpr, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr,
                         MAX_SEQS: gl.constexpr, STAGES_: gl.constexpr, SPLIT: gl.constexpr,
                         PART_ROWS: gl.constexpr, MAX_SPLITS: gl.constexpr, KS: gl.constexpr = 2,
                         V_OFF: gl.constexpr = 0, EVENTS=None, event=0, PROBE: gl.constexpr = 0):
    """`consume_items` for a step that only decodes, in items of BM (8) query rows with the keys as wgmma's M: a
    decode item's rows are its token's query heads of one KV head (4 for Llama-3), which items of 64 rows multiplied
    as 64, every product and the softmax 16 times over (the consumers bound a b64 step's attention: 46.8 us a layer
    against 33.7 with no products, session 71). Scores transposed, s^T = k q^T ([BLOCK, BM]: q's halves from
    qp[0], qp[1]), the online softmax down each column, the outputs transposed too, o^T += v^T p^T (v's halves as
    wgmma's A, MN-major; p^T through qp[2]); the same partials and outputs as `consume_items`. qp: [5+, BM, HD / 2]
    bf16 of shared memory (the consumers' own: q's halves in qp[0, 1] and qp[3, 4] by turns, p^T in qp[2]). A step
    that only decodes has one token a sequence, so an item's rows are one token's query heads: no row's token or
    position to divide out of it by REP, and its keys are all the keys its token sees."""
    BLOCK_: gl.constexpr = k_ring.type.shape[1]
    HW: gl.constexpr = HD // 2
    REP = H // HKV
    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, BM, 16])  # ([BLOCK or HW, BM]: both)
    cols: gl.constexpr = gl.SliceLayout(0, t_layout)  # (a query row each)
    q_load: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    lanes: gl.constexpr = _seq_lanes(MAX_SEQS, gl.num_warps())
    qr = gl.arange(0, BM, layout=gl.SliceLayout(1, q_load))
    qd = gl.arange(0, HW, layout=gl.SliceLayout(0, q_load))
    keys = gl.arange(0, BLOCK_, layout=gl.SliceLayout(1, t_layout))
    od = gl.arange(0, HW, layout=gl.SliceLayout(1, t_layout))
    sc_ = gl.arange(0, BM, layout=cols)
    c = scale * LOG2E  # exp(scale (s - m)) as 2^(s c - m c), as the Triton body's
    S = _splits(I32, control_at, context_lens_at, HKV, splits, BLOCK_, MAX_SEQS, SPLIT, lanes)
    seqs, items, ends, total = _step_items(I32, control_at, seq_starts_at, REP, BM, HKV, S, MAX_SEQS, lanes)
    # an item's words are read an item ahead and so are its queries (after the group's event, looked at once), each
    # left untouched until used: read where they were used, they were three trips to L2 at each item's start
    valid, seq, g, split, m0, start, end, ctx, req = _item_words(0, seqs, items, ends, total, I32, seq_starts_at,
                                                                 context_lens_at, seq_req_at, HKV, S, BM)
    if EVENTS is not None:
        wait(EVENTS, event - 1, gl.num_programs(0))
    q0, q1 = _decode_queries(ACT, q_off, valid, start, g, m0, REP, H, qr, qd, HD)
    n_valid, n_seq, n_g, n_split, n_m0, n_start, n_end, n_ctx, n_req = _item_words(1, seqs, items, ends, total, I32,
                                                                                   seq_starts_at, context_lens_at,
                                                                                   seq_req_at, HKV, S, BM)
    # q's halves alternate between two pairs of qp: the next item's go in during this one's last slot, behind that
    # slot's own barrier, where they had a store and a barrier of their own at each item's start (timed without
    # them, a b64 step's attention took 1.7 us a layer less; with the pairs 43.0-43.4 -> 42.2 us, the 160 groups
    # 5,509-5,514 -> 5,461, H200, session 80)
    qp.index(0).store(q0)
    qp.index(1).store(q1)
    fence_async_shared()
    gl.thread_barrier()  # the first item's q stored before the products read them
    for r in range(gl.cdiv(total, gl.num_programs(0))):
        a_q0, a_q1 = _decode_queries(ACT, q_off, n_valid, n_start, n_g, n_m0, REP, H, qr, qd, HD)
        a_valid, a_seq, a_g, a_split, a_m0, a_start, a_end, a_ctx, a_req = _item_words(r + 2, seqs, items, ends,
                                                                                       total, I32, seq_starts_at,
                                                                                       context_lens_at, seq_req_at,
                                                                                       HKV, S, BM)
        if valid:
            share = gl.cdiv(gl.cdiv(ctx, S), PAGE) * PAGE  # (`_item_keys` where an item's rows are one token's)
            first_key = split * share
            last = gl.minimum(ctx, first_key + share)
            qa = (r % 2) * 3  # (this item's q halves: qp[qa], qp[qa + 1]; the next item's at 3 - qa)
            num_rows = REP
            m = gl.full([BM], NEG, gl.float32, cols)
            sums = gl.zeros([BLOCK_, BM], gl.float32, t_layout)  # (summed down the keys once, after them)
            o0 = gl.zeros([HW, BM], gl.float32, t_layout)
            o1 = gl.zeros([HW, BM], gl.float32, t_layout)
            for j in range(first_key, last, BLOCK_):
                s = i % STAGES_
                mbarrier.wait(ready.index(s), (i // STAGES_) & 1)
                if not PROBE & 32:  # (timing only: with it, no products, each slot released once full)
                    st = warpgroup_mma(k_ring.index(KS * s), qp.index(qa).permute((1, 0)),
                                       gl.zeros([BLOCK_, BM], gl.float32, t_layout), is_async=True)
                    st = warpgroup_mma(k_ring.index(KS * s + 1), qp.index(qa + 1).permute((1, 0)), st,
                                       is_async=True)
                    st = warpgroup_mma_wait(num_outstanding=0, deps=(st, ))
                    key = j + keys
                    st = gl.where((key < last)[:, None], st, NEG)  # (every row's token sees the keys before it)
                    m_new = gl.maximum(m, gl.max(st, axis=0))
                    p = gl.exp2(st * c - (m_new * c)[None, :])
                    alpha = gl.exp2((m - m_new) * c)
                    sums = sums * alpha[None, :] + p
                    m = m_new
                    qp.index(2).permute((1, 0)).store(p.to(gl.bfloat16))
                    if j + BLOCK_ >= last:  # (the item's last slot: the next item's q behind its barrier)
                        qp.index(3 - qa).store(a_q0)
                        qp.index(4 - qa).store(a_q1)
                    fence_async_shared()
                    gl.thread_barrier()  # all of p^T stored before the products read it
                    o0 = warpgroup_mma(v_ring.index(KS * s + V_OFF).permute((1, 0)), qp.index(2).permute((1, 0)),
                                       o0 * alpha[None, :], is_async=True)
                    o1 = warpgroup_mma(v_ring.index(KS * s + V_OFF + 1).permute((1, 0)),
                                       qp.index(2).permute((1, 0)), o1 * alpha[None, :], is_async=True)
                    o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
                # (no proxy fence before the release: the slot is read by wgmma alone, in the async proxy as the
                # loader's copies; ptxas makes `fence_async_shared` a MEMBAR.ALL.CTA, which waits for this thread's
                # loads and stores in flight. Without it the 160 groups 5,472-5,485 -> 5,455-5,468 us, H200,
                # session 81)
                mbarrier.arrive(empty.index(s), count=1)
                i += 1
            if first_key >= last:  # (an item without keys, a split's empty share: the next item's q all the same)
                qp.index(3 - qa).store(a_q0)
                qp.index(4 - qa).store(a_q1)
                fence_async_shared()
                gl.thread_barrier()
            l = gl.sum(sums, axis=0)
            orows = m0 + sc_
            ok = (orows < num_rows)[None, :]
            if SPLIT:
                if S > 1:  # this split's partial, and the last split of the pair to arrive merges them
                    group = seq * HKV + g
                    part = F32 + _region(part_off) + (group * S + split) * (PART_ROWS * (HD + 2))
                    gl.store(part + orows, m * scale, mask=orows < num_rows)
                    gl.store(part + PART_ROWS + orows, l, mask=orows < num_rows)
                    acc = part + 2 * PART_ROWS + orows[None, :] * HD + od[:, None]
                    gl.store(acc, o0, mask=ok)
                    gl.store(acc + HW, o1, mask=ok)
                    _merge_if_last(ACT, F32, out_off, part_off, ticket_off, group, S, start, num_rows, g, REP, H,
                                   PART_ROWS, HD, MAX_SPLITS)
                else:
                    _decode_outputs(ACT, out_off, start, orows, ok, g, REP, H, o0, o1, l, od, HD)
            else:
                _decode_outputs(ACT, out_off, start, orows, ok, g, REP, H, o0, o1, l, od, HD)
        valid, seq, g, split, m0, start, end, ctx, req, q0, q1 = n_valid, n_seq, n_g, n_split, n_m0, n_start, n_end, \
            n_ctx, n_req, a_q0, a_q1
        n_valid, n_seq, n_g, n_split, n_m0, n_start, n_end, n_ctx, n_req = a_valid, a_seq, a_g, a_split, a_m0, \
            a_start, a_end, a_ctx, a_req
    return i


@gluon.jit
def _decode_queries(ACT, q_off, valid, start, g, m0, REP, H, qr, qd, HD: gl.constexpr):
    """An item's query rows' halves, [BM, HD / 2] each, where its rows are one token's query heads (a step that
    only decodes): row r is head g REP + m0 + r of token start (zeros past REP, or for an item not valid: no reads)."""
    heads = g * REP + m0 + qr
    q_rows = ACT + _region(q_off) + (start.to(gl.int64) * H + heads)[:, None] * HD + qd[None, :]
    q_ok = (m0 + qr < REP)[:, None] & valid
    return gl.load(q_rows, mask=q_ok, other=0.0), gl.load(q_rows + HD // 2, mask=q_ok, other=0.0)


@gluon.jit
def _decode_outputs(ACT, out_off, start, orows, ok, g, REP, H, o0, o1, l, od, HD: gl.constexpr):
    """An item's outputs (`ok`'s rows) from transposed outputs ([HD / 2, rows] halves), its rows one token's query
    heads."""
    HW: gl.constexpr = HD // 2
    out = ACT + _region(out_off) + (start.to(gl.int64) * H + g * REP + orows)[None, :] * HD + od[:, None]
    gl.store(out, (o0 / l[None, :]).to(gl.bfloat16), mask=ok)
    gl.store(out + HW, (o1 / l[None, :]).to(gl.bfloat16), mask=ok)


@gluon.jit
def row(desc):
    """The descriptor row's words: q_off, out_off, H, HKV, layer, scale, splits, part_off, ticket_off."""
    H, HKV = gl.load(desc + WORDS[2]).to(gl.int32), gl.load(desc + WORDS[3]).to(gl.int32)
    scale = gl.load(desc + WORDS[6]).to(gl.float64, bitcast=True).to(gl.float32)
    return gl.load(desc + WORDS[0]), gl.load(desc + WORDS[1]), H, HKV, gl.load(desc + WORDS[5]).to(gl.int32), scale, \
        gl.load(desc + WORDS[8]).to(gl.int32), gl.load(desc + WORDS[9]), gl.load(desc + WORDS[10])


@gluon.jit
def attention_prefill(DESCS, ACT, F32, I32, KV, kv_plane, kv_rows, desc_index, control_at, seq_starts_at, context_lens_at,
                      seq_req_at, req_pages_at, HD: gl.constexpr, PAGE: gl.constexpr, PAGES_PER_SEQ: gl.constexpr,
                      MAX_SEQS: gl.constexpr, BLOCK_: gl.constexpr, STAGES_: gl.constexpr, IDS_: gl.constexpr,
                      DESC_WORDS: gl.constexpr, LOADER_REGS: gl.constexpr, SPLIT: gl.constexpr,
                      PART_ROWS: gl.constexpr, MAX_SPLITS: gl.constexpr):
    """Row desc_index of DESCS (an ATTENTION group's descriptor) over the step planned in I32 (control words at
    control_at, the sequences' first tokens, contexts and requests, the requests' page tables at the *_at words);
    the cache KV: kv_rows rows of a token's every KV head, a layer's keys (then values) kv_plane elements apart."""
    q_off, out_off, H, HKV, layer, scale, splits, part_off, ticket_off = row(DESCS + desc_index * DESC_WORDS)
    BM: gl.constexpr = 16 * gl.num_warps()
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_, HD // 2], gl.bfloat16)
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES_ * 2, BLOCK_, HD // 2], layout)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES_ * 2, BLOCK_, HD // 2], layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES_):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (ACT, F32, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at, context_lens_at,
                     seq_req_at, req_pages_at, q_off, out_off, H, HKV, scale, splits, part_off, ticket_off, HD, BM,
                     PAGE, PAGES_PER_SEQ, MAX_SEQS, STAGES_, SPLIT, PART_ROWS, MAX_SPLITS)),
        (_loader, (KV, kv_plane, kv_rows, I32, k_ring, v_ring, ready, empty, control_at, seq_starts_at,
                   context_lens_at, seq_req_at, req_pages_at, layer, H // HKV, HKV, HD, BM, PAGE, PAGES_PER_SEQ,
                   MAX_SEQS, STAGES_, IDS_, splits, SPLIT)),
    ], [1], [LOADER_REGS])


MAX_SPLITS = 32  # a pair's splits at most (`codegen.lower.attention_splits`'s default never gives more)


def constexprs(page_size: int, pages_per_seq: int, max_batch: int, split: bool = False, part_rows: int = 16) -> dict:
    """A launch's constexprs. split: a decode step whose (sequence, KV head) pairs are fewer than the programs, each
    pair's keys in splits, merged by the last to finish; part_rows: a partial's rows in the scratch
    (`CompileConfig.block_m`, as the Triton body lays them out)."""
    return dict(HD=HEAD_DIM, PAGE=page_size, PAGES_PER_SEQ=pages_per_seq,
                MAX_SEQS=max(32, 1 << (max_batch - 1).bit_length()), BLOCK_=BLOCK, STAGES_=STAGES, IDS_=IDS,
                DESC_WORDS=DESC_WORDS, LOADER_REGS=LOADER_REGS, SPLIT=split, PART_ROWS=part_rows,
                MAX_SPLITS=MAX_SPLITS)


def unsupported(words: list[int], page_size: int, bf16_scores: bool) -> str | None:
    """Why an ATTENTION descriptor's group cannot run here (None: it can; a merge group's is its group's)."""
    f = dict(zip(ATTENTION_FIELDS, words))
    if f["head_dim"] != HEAD_DIM:
        return f"its heads have {f['head_dim']} dimensions, not {HEAD_DIM}"
    if bf16_scores:
        return "its scores are rounded to bf16 (`attention_bf16_scores`)"
    if BLOCK % page_size or IDS % (BLOCK // page_size):
        return f"its pages of {page_size} keys do not tile slots of {BLOCK}"
    for name in ("q_off", "out_off"):  # (regions' offsets, `linear._region`)
        if f[name] % ALIGN.value:
            return f"{name} {f[name]} is not a multiple of {ALIGN.value} elements"
    return None


def splits_unsupported(words: list[int], part_rows: int) -> str | None:
    """Why an ATTENTION group (one `unsupported` takes) cannot split a decode step's keys here (None: it can): its
    splits, scratch and tickets (a partial holds part_rows query rows, `CompileConfig.block_m`)."""
    f = dict(zip(ATTENTION_FIELDS, words))
    if f["splits"] < 2 or f["splits"] > MAX_SPLITS:
        return f"its decode steps take {f['splits']} splits, not 2 to {MAX_SPLITS}"
    if f["part_off"] < 0 or f["ticket_off"] < 0 or f["part_off"] % ALIGN.value:
        return "it has no scratch for the splits' partials, or no tickets"
    if f["num_heads"] // f["num_kv_heads"] > part_rows:
        return f"a KV head's {f['num_heads'] // f['num_kv_heads']} query heads are more rows than a partial's"
    return None
