"""A one-row decode step's groups around its layers, in Gluon: the planner, the rows copied from a table,
sampling. With them the one-row chain (`chain.decode_chain`) runs steps back to back in one launch.

They compute what the Triton kernel's bodies compute (codegen/bodies/schedule.py and rows.py), from the same
regions, descriptors and arenas:
- `plan_rows` (program 0, as `plan_step`): each unfinished request's next prompt chunk or last sampled token, in
  request order within the step's token budget; the step's ids, positions, cache slots and the sequences' extents;
  `done` once every request has finished; the step's entry in the step log (the global timer, tokens, sequences),
  from which the runtime reads TPOT. Beside it every program zeroes its share of the norms' sums and the split
  tasks' tickets (`zero_words`).
- `copy_rows`: a table's rows to a step's rows, each stored row's sum of squares added into its norm's sums (the
  embedding, as `embed_task`, by the step's token ids; the rows that need logits, as `gather_task`).
- `sample` (as `sample_task`): each of the descriptor's `splits` chunks of the vocabulary its first maximum (at
  temperature 0) or its Gumbel-max draw (`sampling.py`, where SAMPLING), the last chunk to arrive the first best of
  them (torch.argmax's first index), checked against top-k and top-p where it is a draw, then `emit`: the token
  appended to the request's outputs, and the request finished at an EOS id (unless ignored) or its max tokens.
Region offsets come at run time in REGIONS (int32, `REGION_NAMES` order: the I32 arena's, `req_temperature` and
`req_top_p` the F32 one's), read where a body needs them.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from codegen.bodies.schedule import SAMPLE_FIELDS
from codegen.gluon import sampling
from codegen.gluon.attention import _add
from codegen.gluon.linear import _norm_sums, _round

REGION_NAMES = ("control", "input_ids", "positions", "slots", "seq_starts", "context_lens", "seq_req", "logits_rows",
                "seq_final", "req_prompt_off", "req_prompt_len", "req_cached", "req_finished", "req_last",
                "req_pages", "prompts", "req_num_out", "req_max_tokens", "req_ignore_eos", "out_tokens", "eos_ids",
                "step_log", "req_seed", "req_top_k", "req_temperature", "req_top_p")
(CONTROL, INPUT_IDS, POSITIONS, SLOTS, SEQ_STARTS, CONTEXT_LENS, SEQ_REQ, LOGITS_ROWS, SEQ_FINAL, REQ_PROMPT_OFF,
 REQ_PROMPT_LEN, REQ_CACHED, REQ_FINISHED, REQ_LAST, REQ_PAGES, PROMPTS, REQ_NUM_OUT, REQ_MAX_TOKENS, REQ_IGNORE_EOS,
 OUT_TOKENS, EOS_IDS, STEP_LOG_AT, REQ_SEED, REQ_TOP_K, REQ_TEMPERATURE, REQ_TOP_P) = \
    (gl.constexpr(i) for i in range(len(REGION_NAMES)))
CHUNK = gl.constexpr(128)  # a prompt chunk's tokens written at once


@gluon.jit
def _at(REGIONS, name: gl.constexpr):
    return gl.load(REGIONS + name)


@gluon.jit
def _pick(values, lanes, q):
    """Lane q's value of a tensor over the lanes."""
    return gl.sum(gl.where(lanes == q, values, 0), axis=0)


@gluon.jit
def plan_rows(I32, REGIONS, step, PAGES_PER_SEQ: gl.constexpr, PAGE: gl.constexpr, MAX_TOKENS: gl.constexpr,
              REQS: gl.constexpr, STEP_LOG: gl.constexpr):
    """`plan_step` for step `step`: every request at once (REQS lanes, a power of two at least the requests), and the
    step's log entry. What `plan_step` also zeroes (the norms' sums, the tickets), every program zeroes beside it
    (`zero_words`)."""
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    control = I32 + _at(REGIONS, CONTROL)
    num_requests = gl.load(control + 4)
    r = gl.arange(0, REQS, layout=lanes)
    unfinished = (r < num_requests) & \
        (gl.load(I32 + _at(REGIONS, REQ_FINISHED) + r, mask=r < num_requests, other=1) == 0)
    cached = gl.load(I32 + _at(REGIONS, REQ_CACHED) + r, mask=unfinished, other=0)
    prompt_len = gl.load(I32 + _at(REGIONS, REQ_PROMPT_LEN) + r, mask=unfinished, other=0)
    want = gl.where(unfinished, gl.maximum(prompt_len - cached, 1), 0)
    before = gl.associative_scan(want, 0, _add) - want  # what the requests before want
    n = gl.minimum(want, gl.maximum(MAX_TOKENS - before, 0))  # as they take it in order: the budget's rest
    t = gl.minimum(before, MAX_TOKENS)
    has = (n > 0).to(gl.int32)
    b = gl.associative_scan(has, 0, _add) - has
    one = n == 1  # the token at `cached`: the prompt's next, or the last one sampled
    in_prompt = one & (cached < prompt_len)
    offset = gl.load(I32 + _at(REGIONS, REQ_PROMPT_OFF) + r, mask=in_prompt, other=0)
    prompts = I32 + _at(REGIONS, PROMPTS)
    token = gl.where(in_prompt, gl.load(prompts + offset + cached, mask=in_prompt, other=0),
                     gl.load(I32 + _at(REGIONS, REQ_LAST) + r, mask=one, other=0))
    pages = I32 + _at(REGIONS, REQ_PAGES)
    page = gl.load(pages + r * PAGES_PER_SEQ + cached // PAGE, mask=one, other=0)
    if gl.max(n, axis=0) > 1:
        for q in range(num_requests):
            _write_chunk(I32, REGIONS, q, _pick(n, r, q), _pick(cached, r, q), _pick(prompt_len, r, q),
                         _pick(t, r, q), PAGES_PER_SEQ, PAGE)
    # every warp has read the requests' state before any warp moves it on (`plan_step`'s barrier)
    gl.thread_barrier()
    gl.store(I32 + _at(REGIONS, INPUT_IDS) + t, token, mask=one)
    gl.store(I32 + _at(REGIONS, POSITIONS) + t, cached, mask=one)
    gl.store(I32 + _at(REGIONS, SLOTS) + t, page * PAGE + cached % PAGE, mask=one)
    seq = n > 0
    seq_starts = I32 + _at(REGIONS, SEQ_STARTS)
    gl.store(seq_starts + b, t, mask=seq)
    gl.store(I32 + _at(REGIONS, CONTEXT_LENS) + b, cached + n, mask=seq)
    gl.store(I32 + _at(REGIONS, SEQ_REQ) + b, r, mask=seq)
    gl.store(I32 + _at(REGIONS, LOGITS_ROWS) + b, t + n - 1, mask=seq)
    gl.store(I32 + _at(REGIONS, SEQ_FINAL) + b, (cached + n >= prompt_len).to(gl.int32), mask=seq)
    gl.store(I32 + _at(REGIONS, REQ_CACHED) + r, cached + n, mask=seq)
    num_tokens = gl.sum(n, axis=0)
    num_seqs = gl.sum(has, axis=0)
    gl.store(seq_starts + num_seqs, num_tokens)
    gl.store(control + 0, num_tokens)
    gl.store(control + 1, num_seqs)
    if num_seqs > 0:  # the last step with sequences: its logits rows outlast the empty plan that ends a launch
        gl.store(control + 13, num_seqs)
    gl.store(control + 2, (gl.sum(unfinished.to(gl.int32), axis=0) == 0).to(gl.int32))
    gl.store(control + 3, step)
    clock = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [step], dtype=gl.int64, is_pure=False,
                                      pack=1)
    log = I32 + _at(REGIONS, STEP_LOG_AT) + (step % STEP_LOG) * 4
    gl.store(log, clock.to(gl.int32))
    gl.store(log + 1, (clock >> 32).to(gl.int32))
    gl.store(log + 2, num_tokens)
    gl.store(log + 3, num_seqs)


@gluon.jit
def zero_words(F32, off, size):
    """The F32 words off .. off + size zeroed, the programs taking blocks of them in turn: a step's norms' sums and
    tickets, ~1 MB for 65 norms of 2,048 rows in fp64. Program 0 alone zeroing them held every b64 step of the
    batched loop 31.7 us in its plan; shared, the plan takes 5.2 (the H200, session 72)."""
    flat: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    BLOCK: gl.constexpr = 4 * 32 * gl.num_warps()
    for z in range(gl.program_id(0) * BLOCK, size, gl.num_programs(0) * BLOCK):
        zs = z + gl.arange(0, BLOCK, layout=flat)
        gl.store(F32 + off + zs, gl.zeros([BLOCK], gl.float32, flat), mask=zs < size)


@gluon.jit
def _write_chunk(I32, REGIONS, q, n, cached, prompt_len, t, PAGES_PER_SEQ: gl.constexpr, PAGE: gl.constexpr):
    """Request q's n tokens from position `cached` (where n > 1) at the step's rows t ..: ids, positions, slots."""
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    if n > 1:
        offset = gl.load(I32 + _at(REGIONS, REQ_PROMPT_OFF) + q)
        last = gl.load(I32 + _at(REGIONS, REQ_LAST) + q)
        for c in range(0, n, CHUNK):
            i = c + gl.arange(0, CHUNK, layout=flat)
            ok = i < n
            pos = cached + i
            from_prompt = gl.load(I32 + _at(REGIONS, PROMPTS) + offset + pos, mask=ok & (pos < prompt_len), other=0)
            page = gl.load(I32 + _at(REGIONS, REQ_PAGES) + q * PAGES_PER_SEQ + pos // PAGE, mask=ok, other=0)
            gl.store(I32 + _at(REGIONS, INPUT_IDS) + t + i, gl.where(pos < prompt_len, from_prompt, last), mask=ok)
            gl.store(I32 + _at(REGIONS, POSITIONS) + t + i, pos, mask=ok)
            gl.store(I32 + _at(REGIONS, SLOTS) + t + i, page * PAGE + pos % PAGE, mask=ok)


@gluon.jit
def copy_rows(SRC, src_off, ids, n, ACT, F32, hidden, out_off, out_stats_off, NORM_F64: gl.constexpr):
    """Rows ids[0], .. ids[n - 1] of SRC's [., hidden] rows at src_off into the step's rows 0 .. n - 1 at out_off
    (`hidden` apart), in pieces of 4 columns a thread that the programs take in turn (piece p of row r: item r pieces
    + p), each stored row's sum of squares added into its norm's sums at out_stats_off (none where negative). As
    `copy_rows` (codegen/bodies/rows.py)."""
    flat: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    BLOCK: gl.constexpr = 4 * 32 * gl.num_warps()
    pieces = gl.cdiv(hidden, BLOCK)
    for item in range(gl.program_id(0), n * pieces, gl.num_programs(0)):
        r = item // pieces
        cols = (item % pieces) * BLOCK + gl.arange(0, BLOCK, layout=flat)
        ok = cols < hidden
        row = gl.load(ids + r)
        y = gl.load(SRC + src_off + row.to(gl.int64) * hidden + cols, mask=ok, other=0.0).to(gl.float32)
        gl.store(ACT + out_off + r * hidden + cols, y.to(gl.bfloat16), mask=ok)
        if out_stats_off >= 0:
            y = _round(y)
            sums = _norm_sums(F32, out_stats_off, NORM_F64) + r
            gl.atomic_add(sums, gl.sum(gl.where(ok, y * y, 0.0), axis=0).to(sums.dtype.element_ty),
                          sem="relaxed")  # (published by the group's signal, `chain._signal`)


assert SAMPLE_FIELDS == ("logits_off", "vocab", "splits", "part_off", "ticket_off", "top_off")  # (`sample`'s)


@gluon.jit
def sample(desc, I32, F32, REGIONS, num_seqs, VB: gl.constexpr, WB: gl.constexpr, MAX_NEW: gl.constexpr,
           SAMPLING: gl.constexpr):
    """`sample_task` for a step of num_seqs sequences that each sample: the programs take its (sequence, chunk)
    items in turn (item b splits + p: chunk p of sequence b's logits, VB at a time), each storing its first maximum,
    or (SAMPLING, a request with a temperature) its Gumbel-max draw and largest z; a sequence's last chunk to arrive
    takes the first best of them, checks a draw against top-k and top-p (passes of WB logits,
    `sampling.draw_within`), and emits it. A sequence's partials, ticket and cut scratch as `sample_task` has them."""
    logits_off, vocab = gl.load(desc + 0), gl.load(desc + 1).to(gl.int32)
    splits, part_off, ticket_off = gl.load(desc + 2).to(gl.int32), gl.load(desc + 3), gl.load(desc + 4)
    width = gl.cdiv(gl.cdiv(vocab, splits), VB) * VB
    for item in range(gl.program_id(0), num_seqs * splits, gl.num_programs(0)):
        b = item // splits
        chunk = item % splits
        if gl.load(I32 + _at(REGIONS, SEQ_FINAL) + b) == 1:
            r = gl.load(I32 + _at(REGIONS, SEQ_REQ) + b)
            row = logits_off + b * vocab
            lo = chunk * width
            hi = gl.minimum(vocab, lo + width)
            part = F32 + part_off + b * splits * 2
            ticket = F32 + ticket_off + b
            if SAMPLING:
                temperature = gl.load(F32 + _at(REGIONS, REQ_TEMPERATURE) + r)
                seed = gl.load(I32 + _at(REGIONS, REQ_SEED) + r)
                draw = gl.load(I32 + _at(REGIONS, REQ_NUM_OUT) + r)
                tops = F32 + gl.load(desc + 5) + b * (splits + WB + 1)
                if temperature == 0.0:
                    best, index = _argmax(F32, row, lo, hi, VB)
                else:
                    best, index, z_top = sampling.gumbel_max(F32, row, lo, hi, vocab, VB, seed, draw, temperature,
                                                             float("-inf"), float("-inf"))
                    gl.store(tops + chunk, z_top)
                if _arrives_last(part, chunk, best, index, ticket, splits):
                    token = _first_best(part, splits)
                    if temperature != 0.0:
                        token = sampling.draw_within(F32, row, vocab, WB, VB, seed, draw, temperature,
                                                     gl.load(I32 + _at(REGIONS, REQ_TOP_K) + r),
                                                     gl.load(F32 + _at(REGIONS, REQ_TOP_P) + r), token,
                                                     _largest(tops, splits), tops + splits)
                    emit(I32, REGIONS, r, token, MAX_NEW)
            else:
                best, index = _argmax(F32, row, lo, hi, VB)
                if _arrives_last(part, chunk, best, index, ticket, splits):
                    emit(I32, REGIONS, r, _first_best(part, splits), MAX_NEW)


@gluon.jit
def _arrives_last(part, chunk, best, index, ticket, splits):
    """The chunk's (value, token) stored, then its ticket taken: whether it is the last of `splits` to arrive
    (`arrives_last`: the release publishes every thread's stores, the acquire lets the last read everyone's)."""
    gl.store(part + chunk * 2, best)
    gl.store(part + chunk * 2 + 1, index.to(gl.float32))
    gl.thread_barrier()
    arrived = gl.atomic_add(ticket, 1.0, sem="acq_rel")
    gl.thread_barrier()
    return arrived == splits - 1


@gluon.jit
def _argmax(F32, row, lo, hi, VB: gl.constexpr):
    """(max, first argmax) of the logits in lo .. hi, VB at a time (`_argmax`)."""
    flat: gl.constexpr = gl.BlockedLayout([VB // (32 * gl.num_warps())], [32], [gl.num_warps()], [0])
    best = gl.to_tensor(float("-inf"))
    index = gl.to_tensor(0)
    for v0 in range(lo, hi, VB):
        v = v0 + gl.arange(0, VB, layout=flat)
        z = gl.load(F32 + row + v, mask=v < hi, other=float("-inf"))
        m = gl.max(z, axis=0)
        i = gl.min(gl.where(z == m, v, 2147483647), axis=0)  # (the first of a tie, as torch.argmax)
        if m > best:
            best = m
            index = i
    return best, index


@gluon.jit
def _first_best(part, splits):
    """The token of the largest of the chunks' (value, token) pairs at `part`, the earliest chunk's of a tie
    (`_first_max`)."""
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    c = gl.arange(0, 32, layout=lanes)
    token = gl.to_tensor(0)
    top = gl.to_tensor(float("-inf"))
    for c0 in range(0, splits, 32):
        values = gl.load(part + (c0 + c) * 2, mask=c0 + c < splits, other=float("-inf"), cache_modifier=".cg")
        m = gl.max(values, axis=0)
        first = gl.min(gl.where(values == m, c0 + c, 2147483647), axis=0)
        if m > top:
            top = m
            token = gl.load(part + first * 2 + 1, cache_modifier=".cg").to(gl.int32)
    return token


@gluon.jit
def _largest(values, splits):
    """The largest of the chunks' `splits` values (`_largest`)."""
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    c = gl.arange(0, 32, layout=lanes)
    top = gl.to_tensor(float("-inf"))
    for c0 in range(0, splits, 32):
        top = gl.maximum(top, gl.max(gl.load(values + c0 + c, mask=c0 + c < splits, other=float("-inf"),
                                             cache_modifier=".cg"), axis=0))
    return top


@gluon.jit
def emit(I32, REGIONS, r, token, MAX_NEW: gl.constexpr):
    """`_emit`: request r's token appended to its outputs (MAX_NEW a request) and kept as its last, and whether it
    has finished (1 at its max tokens, 2 at an EOS id it does not ignore)."""
    control = I32 + _at(REGIONS, CONTROL)
    num_out = I32 + _at(REGIONS, REQ_NUM_OUT) + r
    n = gl.load(num_out)
    eos = I32 + _at(REGIONS, EOS_IDS)
    is_eos = gl.to_tensor(0)
    for i in range(gl.load(control + 5)):
        is_eos = is_eos | (gl.load(eos + i) == token).to(gl.int32)
    at_max = (n + 1 >= gl.load(I32 + _at(REGIONS, REQ_MAX_TOKENS) + r)).to(gl.int32)
    stop = (is_eos * (1 - gl.load(I32 + _at(REGIONS, REQ_IGNORE_EOS) + r))) | at_max
    gl.thread_barrier()  # every warp's reads before any store moves the request on
    gl.store(I32 + _at(REGIONS, OUT_TOKENS) + r * MAX_NEW + n, token)
    gl.store(num_out, n + 1)
    gl.store(I32 + _at(REGIONS, REQ_LAST) + r, token)
    gl.store(I32 + _at(REGIONS, REQ_FINISHED) + r, gl.where(stop > 0, 1 + is_eos, 0))
