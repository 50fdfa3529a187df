"""The step planner (program 0, at the start of every step) and the sampler (one task per sequence).

The planner turns request state into the step's inputs: each unfinished request brings its next prompt
chunk (within the step's token budget) or its last sampled token; it writes token ids, positions, cache
slots (from the request's pages), the sequences' extents, and zeroes the norm statistics. When no request
is left it sets `done`. The sampler picks each finished chunk's next token on the GPU: greedy, or Gumbel-max
over temperature-scaled logits restricted by top-k and top-p, with a per-request seed. Both spread the row
over the sequence's tasks; a cut costs the last of them a pass or a few over the row.
"""
import triton
import triton.language as tl

from codegen.bodies.common import arrives_last

SAMPLE_FIELDS = ("logits_off", "vocab", "splits", "part_off", "ticket_off", "top_off")


@triton.jit
def plan_step(I32, F32, step, CONTROL: tl.constexpr, INPUT_IDS: tl.constexpr, POSITIONS: tl.constexpr,
              SLOTS: tl.constexpr, SEQ_STARTS: tl.constexpr, CONTEXT_LENS: tl.constexpr, SEQ_REQ: tl.constexpr,
              LOGITS_ROWS: tl.constexpr, SEQ_FINAL: tl.constexpr, REQ_PROMPT_OFF: tl.constexpr,
              REQ_PROMPT_LEN: tl.constexpr, REQ_CACHED: tl.constexpr, REQ_FINISHED: tl.constexpr,
              REQ_LAST: tl.constexpr, REQ_PAGES: tl.constexpr, PROMPTS: tl.constexpr,
              PAGES_PER_SEQ: tl.constexpr, PAGE_SIZE: tl.constexpr, MAX_TOKENS: tl.constexpr,
              STATS_OFF: tl.constexpr, STATS_SIZE: tl.constexpr, CHUNK: tl.constexpr, REQS: tl.constexpr):
    """Every request at once (REQS lanes, a power of two at least the launch's requests): each unfinished one
    takes its next prompt chunk, or one token, of what is left of the step's token budget, in request order,
    and its place in the step (sequence b, first token t) from prefix sums. A request of one token is written
    by its own lane; a longer chunk a request at a time. (A loop over the requests, a few dependent loads and
    a barrier each: a batch-64 step spent ~120 us between its last sampling task and its next first task, and
    taking the requests at once gave back 30-70 us of it on an H200: benchmarks/RESULTS.md, session 52.)"""
    for z in range(0, STATS_SIZE, CHUNK):
        zs = z + tl.arange(0, CHUNK)
        tl.store(F32 + STATS_OFF + zs, tl.zeros((CHUNK,), tl.float32), mask=zs < STATS_SIZE)
    num_requests = tl.load(I32 + CONTROL + 4)
    r = tl.arange(0, REQS)
    unfinished = (r < num_requests) & (tl.load(I32 + REQ_FINISHED + r, mask=r < num_requests, other=1) == 0)
    cached = tl.load(I32 + REQ_CACHED + r, mask=unfinished, other=0)
    prompt_len = tl.load(I32 + REQ_PROMPT_LEN + r, mask=unfinished, other=0)
    want = tl.where(unfinished, tl.maximum(prompt_len - cached, 1), 0)
    before = tl.cumsum(want, 0) - want  # what the requests before want
    n = tl.minimum(want, tl.maximum(MAX_TOKENS - before, 0))  # as they take it in order: the budget's rest
    t = tl.minimum(before, MAX_TOKENS)
    has = (n > 0).to(tl.int32)
    b = tl.cumsum(has, 0) - has
    one = n == 1  # the token at `cached`: the prompt's next, or the last one sampled
    in_prompt = one & (cached < prompt_len)
    offset = tl.load(I32 + REQ_PROMPT_OFF + r, mask=in_prompt, other=0)
    token = tl.where(in_prompt, tl.load(I32 + PROMPTS + offset + cached, mask=in_prompt, other=0),
                     tl.load(I32 + REQ_LAST + r, mask=one, other=0))
    page = tl.load(I32 + REQ_PAGES + r * PAGES_PER_SEQ + cached // PAGE_SIZE, mask=one, other=0)
    if tl.max(n, 0) > 1:
        for q in range(num_requests):
            _write_chunk(I32, q, tl.sum(tl.where(r == q, n, 0), 0), tl.sum(tl.where(r == q, cached, 0), 0),
                         tl.sum(tl.where(r == q, prompt_len, 0), 0), tl.sum(tl.where(r == q, t, 0), 0),
                         INPUT_IDS, POSITIONS, SLOTS, REQ_PROMPT_OFF, REQ_LAST, REQ_PAGES, PROMPTS, PAGES_PER_SEQ,
                         PAGE_SIZE, CHUNK)
    # every warp has read the requests' state before any warp moves it on: warps are not in step, and a lane's
    # values may be held by threads of two warps. (Without such a barrier a 64-prompt prefill wrote runs of 32
    # rows of token ids, positions and slots wrong in 4 of 12 launches: `benchmarks/explore/region_diff.py`.)
    tl.debug_barrier()
    tl.store(I32 + INPUT_IDS + t, token, mask=one)
    tl.store(I32 + POSITIONS + t, cached, mask=one)
    tl.store(I32 + SLOTS + t, page * PAGE_SIZE + cached % PAGE_SIZE, mask=one)
    seq = n > 0
    tl.store(I32 + SEQ_STARTS + b, t, mask=seq)
    tl.store(I32 + CONTEXT_LENS + b, cached + n, mask=seq)
    tl.store(I32 + SEQ_REQ + b, r, mask=seq)
    tl.store(I32 + LOGITS_ROWS + b, t + n - 1, mask=seq)
    tl.store(I32 + SEQ_FINAL + b, (cached + n >= prompt_len).to(tl.int32), mask=seq)
    tl.store(I32 + REQ_CACHED + r, cached + n, mask=seq)
    num_tokens = tl.sum(n, 0)
    num_seqs = tl.sum(has, 0)
    tl.store(I32 + SEQ_STARTS + num_seqs, num_tokens)
    tl.store(I32 + CONTROL + 0, num_tokens)
    tl.store(I32 + CONTROL + 1, num_seqs)
    if num_seqs > 0:  # the last step with sequences: its logits rows outlast the empty plan that ends a launch
        tl.store(I32 + CONTROL + 13, num_seqs)
    tl.store(I32 + CONTROL + 2, (tl.sum(unfinished.to(tl.int32), 0) == 0).to(tl.int32))
    tl.store(I32 + CONTROL + 3, step)


@triton.jit
def _write_chunk(I32, q, n, cached, prompt_len, t, INPUT_IDS: tl.constexpr, POSITIONS: tl.constexpr,
                 SLOTS: tl.constexpr, REQ_PROMPT_OFF: tl.constexpr, REQ_LAST: tl.constexpr, REQ_PAGES: tl.constexpr,
                 PROMPTS: tl.constexpr, PAGES_PER_SEQ: tl.constexpr, PAGE_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """Request q's n tokens from position `cached` (where n > 1) at the step's rows t ..: ids, positions, slots."""
    if n > 1:
        for c in range(0, n, CHUNK):
            i = c + tl.arange(0, CHUNK)
            ok = i < n
            pos = cached + i
            from_prompt = tl.load(I32 + PROMPTS + tl.load(I32 + REQ_PROMPT_OFF + q) + pos,
                                  mask=ok & (pos < prompt_len), other=0)
            token = tl.where(pos < prompt_len, from_prompt, tl.load(I32 + REQ_LAST + q))
            page = tl.load(I32 + REQ_PAGES + q * PAGES_PER_SEQ + pos // PAGE_SIZE, mask=ok, other=0)
            tl.store(I32 + INPUT_IDS + t + i, token, mask=ok)
            tl.store(I32 + POSITIONS + t + i, pos, mask=ok)
            tl.store(I32 + SLOTS + t + i, page * PAGE_SIZE + pos % PAGE_SIZE, mask=ok)


@triton.jit
def sample_task(desc, tile, I32, F32, num_seqs, step, CONTROL: tl.constexpr, SEQ_REQ: tl.constexpr,
                SEQ_FINAL: tl.constexpr, REQ_NUM_OUT: tl.constexpr, REQ_MAX_TOKENS: tl.constexpr,
                REQ_FINISHED: tl.constexpr, REQ_LAST: tl.constexpr, REQ_SEED: tl.constexpr,
                REQ_TOP_K: tl.constexpr, REQ_IGNORE_EOS: tl.constexpr, REQ_TEMPERATURE: tl.constexpr,
                REQ_TOP_P: tl.constexpr, OUT_TOKENS: tl.constexpr, MAX_NEW: tl.constexpr, EOS_IDS: tl.constexpr,
                VB: tl.constexpr, WB: tl.constexpr):
    """Task (sequence, vocabulary chunk). Each chunk finds its candidate, the last to finish takes the first
    best one in order: greedy, the argmax of the logits; sampling (`_sample`), a Gumbel-max draw."""
    logits_off, vocab = tl.load(desc + 0), tl.load(desc + 1).to(tl.int32)
    splits, part_off, ticket_off = tl.load(desc + 2), tl.load(desc + 3), tl.load(desc + 4)
    b = tile // splits
    chunk = tile % splits
    if b < num_seqs:
        if tl.load(I32 + SEQ_FINAL + b) == 1:
            r = tl.load(I32 + SEQ_REQ + b)
            row = logits_off + b * vocab
            temperature = tl.load(F32 + REQ_TEMPERATURE + r)
            width = tl.cdiv(tl.cdiv(vocab, splits), VB) * VB
            lo = (chunk * width).to(tl.int32)
            hi = tl.minimum(vocab, lo + width)
            part = F32 + part_off + b * splits * 2
            token = -1
            if temperature == 0.0:
                best, index = _argmax(F32, row, lo, hi, VB)
                if splits == 1:
                    token = index
                else:
                    tl.store(part + chunk * 2, best)
                    tl.store(part + chunk * 2 + 1, index.to(tl.float32))
                    if arrives_last(F32 + ticket_off + b, splits):
                        token = _first_max(part, splits)
            else:
                token = _sample(F32, row, vocab, lo, hi, part, F32 + tl.load(desc + 5) + b * (splits + WB + 1),
                                chunk, splits, F32 + ticket_off + b, tl.load(I32 + REQ_SEED + r),
                                tl.load(I32 + REQ_NUM_OUT + r), temperature, tl.load(I32 + REQ_TOP_K + r),
                                tl.load(F32 + REQ_TOP_P + r), VB, WB)
            if token >= 0:
                _emit(I32, r, token, CONTROL, REQ_NUM_OUT, REQ_MAX_TOKENS, REQ_FINISHED, REQ_LAST, REQ_IGNORE_EOS,
                      OUT_TOKENS, MAX_NEW, EOS_IDS)


@triton.jit(noinline=True)
def _sample(F32, row, vocab, lo, hi, part, tops, chunk, splits, ticket, seed, draw, temperature, top_k, top_p,
            VB: tl.constexpr, WB: tl.constexpr):
    """A sampling task's part: the Gumbel-max draw over its chunk of z = logits / temperature (each token's
    noise drawn by its index, so the chunks together draw what the whole row would); the last chunk to
    finish takes the row's draw and checks it against the cut (`_draw_within`, over blocks of WB logits).
    The token, or -1 for every other chunk. A function of its own (`noinline`): its registers, and the
    cut's code, stay out of the other bodies' allocation (inlined, greedy Llama-3-8B b64 lost 2-3%;
    outlined, 1%: benchmarks/RESULTS.md, session 25)."""
    best, index, z_top = _gumbel_max(F32, row, lo, hi, vocab, VB, seed, draw, temperature, float("-inf"),
                                     float("-inf"))
    tl.store(part + chunk * 2, best)
    tl.store(part + chunk * 2 + 1, index.to(tl.float32))
    tl.store(tops + chunk, z_top)
    token = -1
    if arrives_last(ticket, splits):
        token = _draw_within(F32, row, vocab, WB, VB, seed, draw, temperature, top_k, top_p,
                             _first_max(part, splits), _largest(tops, splits), tops + splits)
    return token


@triton.jit
def _first_max(part, splits):
    """The token of the largest chunk maximum; the earliest chunk wins a tie, as torch.argmax's first index."""
    best = float("-inf")
    token = 0
    for c in range(0, splits):
        value = tl.load(part + c * 2)
        if value > best:
            best = value
            token = tl.load(part + c * 2 + 1).to(tl.int32)
    return token


@triton.jit
def _largest(values, splits):
    """The largest of the chunks' `splits` values."""
    top = float("-inf")
    for c in range(0, splits):
        top = tl.maximum(top, tl.load(values + c))
    return top


@triton.jit
def _argmax(F32, row, lo, hi, VB: tl.constexpr):
    """(max, first argmax) of the logits v in lo .. hi."""
    best_val = float("-inf")
    best_idx = 0
    for v0 in range(lo, hi, VB):
        v = v0 + tl.arange(0, VB)
        z = tl.load(F32 + row + v, mask=v < hi, other=float("-inf"))
        m = tl.max(z, 0)
        i = tl.argmax(z, 0)
        if m > best_val:
            best_val = m
            best_idx = (v0 + i).to(tl.int32)
    return best_val, best_idx


@triton.jit
def _gumbel_max(F32, row, lo, hi, vocab, VB: tl.constexpr, seed, draw, temperature, above, at_least):
    """Gumbel-max over the tokens v in lo .. hi with above < z_v and at_least <= z_v, z = logits / temperature:
    (max of z_v + g_v, its first token, max of z_v over lo .. hi). Token v's noise g_v is -log(-log(u)), u
    draw `draw * vocab + v` of the seed's stream: the same whichever task or pass computes it. A block with
    no token in range draws no noise."""
    best_val = float("-inf")
    best_idx = 0
    z_top = float("-inf")
    for v0 in range(lo, hi, VB):
        v = v0 + tl.arange(0, VB)
        z = tl.load(F32 + row + v, mask=v < hi, other=float("-inf")) / temperature
        z_top = tl.maximum(z_top, tl.max(z, 0))
        keep = (z > above) & (z >= at_least)
        if tl.max(keep.to(tl.int32), 0) > 0:
            u = tl.rand(seed, draw * vocab + v)
            z = tl.where(keep, z - tl.log(-tl.log(tl.maximum(u, 1e-10))), float("-inf"))
            m = tl.max(z, 0)
            i = tl.argmax(z, 0)
            if m > best_val:
                best_val = m
                best_idx = (v0 + i).to(tl.int32)
    return best_val, best_idx, z_top


@triton.jit
def _draw_within(F32, row, vocab, VB: tl.constexpr, NB: tl.constexpr, seed, draw, temperature, top_k, top_p, token,
                 z_top, cands):
    """The Gumbel-max draw over the tokens that survive top-k and then top-p, given `token`, the draw over
    the whole row. The argmax over a set is the argmax over any subset it lands in, so the draw stands
    whenever it survives the cut, and the cut needs no sort:
    - top-k keeps z >= the k-th largest z (ties at it survive): the draw survives it when fewer than k
      tokens lie above it (one pass, which also settles top-p when the tokens at or above the draw, a part
      of the kept mass, already hold enough). Only a draw that pass cannot settle takes the k-th largest z
      itself, exactly, from a radix select (`_kth_largest`: a pass or two over the row, then a block);
    - top-p keeps a token while the tokens above it hold less than top_p of the kept mass (the smallest
      nucleus). A rejected draw gives way to the draw over the tokens above it, which still hold the whole
      nucleus, until one survives: a pass over the row a try, and rarely a second try."""
    at_least = float("-inf")
    z = tl.load(F32 + row + token) / temperature
    above = float("-inf")
    settled = False
    redraw = False
    if (top_k > 0) & (top_k < vocab):
        count, mass, from_draw = _masses(F32, row, vocab, VB, temperature, z, z, z_top)
        # kept mass >= from_draw once the draw is in the top k, and floating-point sums are monotone, so
        # this accepts only what the exact test below would
        settled = (count < top_k) & ((top_p >= 1.0) | (mass < top_p * from_draw))
        if not settled:
            # the k-th largest lies above the draw when k tokens do
            z_low = tl.where(count >= top_k, z, float("-inf"))
            at_least = _kth_largest(F32, row, vocab, VB, temperature, top_k, z_low, z_top, cands)
            redraw = z < at_least
    if (not settled) & (not redraw) & (top_p < 1.0):
        _, mass, kept = _masses(F32, row, vocab, VB, temperature, z, at_least, z_top)
        redraw = mass >= top_p * kept
        above = z
    while redraw:
        # in blocks of NB, smaller than the passes' VB: a block with no kept token draws no noise
        token = _gumbel_max(F32, row, 0, vocab, vocab, NB, seed, draw, temperature, above, at_least)[1]
        z = tl.load(F32 + row + token) / temperature
        redraw = False
        if top_p < 1.0:
            _, mass, kept = _masses(F32, row, vocab, VB, temperature, z, at_least, z_top)
            redraw = mass >= top_p * kept
            above = z
    return token


@triton.jit(noinline=True)
def _masses(F32, row, vocab, VB: tl.constexpr, temperature, z_cut, at_least, z_top):
    """The tokens with z > z_cut: how many, and their probability mass (unnormalized); and the mass of
    those with z >= at_least. A function of its own: inlined into `_sample` (three calls), it raised the
    kernel's spills (Llama-3-8B b64 304 -> 392 B a thread) and greedy b64 lost 1.2%."""
    count = 0
    above = 0.0
    kept = 0.0
    for v0 in range(0, vocab, VB):
        v = v0 + tl.arange(0, VB)
        z = tl.load(F32 + row + v, mask=v < vocab, other=float("-inf")) / temperature
        p = tl.exp(z - z_top)
        count += tl.sum((z > z_cut).to(tl.int32), 0)
        above += tl.sum(tl.where(z > z_cut, p, 0.0), 0)
        kept += tl.sum(tl.where(z >= at_least, p, 0.0), 0)
    return count, above, kept


@triton.jit
def _kth_largest(F32, row, vocab, VB: tl.constexpr, temperature, k, z_low, z_top, cands, DIGIT: tl.constexpr = 6):
    """The k-th largest z of the row, exactly, given z_low <= it and z_top, the row's largest z: a radix select
    over z's bits read as an order-preserving key (`_key`), DIGIT bits a pass (a histogram of 2^DIGIT bins: over
    128K flat logits 5 and 6 bits took 0.23-0.25 ms, 4 and 8 0.31-0.37; benchmarks/RESULTS.md, session 27),
    from the highest bit in which z_low's key and z_top's differ (the bits above are the answer's too). Once the
    keys that share the bits decided so far fit a block (VB), one pass copies their logits to `cands` (VB floats,
    then a counter) and the passes left read that block alone. (Four passes of 256 bins over the whole row, the
    select before, took ~0.3 ms more at b1 on random weights: benchmarks/RESULTS.md, session 27.)"""
    hi = _key(z_top)
    top = _bit_length(_key(z_low) ^ hi)  # bits still to decide (0 when z_low is z_top)
    prefix = hi ^ _low_bits(hi, top)  # the bits decided, the others 0
    want = k  # rank of the answer among the keys that share the decided bits (none lies above z_top)
    src = F32 + row
    n = vocab
    copied = 0
    while top > 0:
        shift = tl.maximum(top - DIGIT, 0)
        digits = tl.arange(0, 1 << DIGIT)
        counts = tl.zeros((1 << DIGIT,), tl.int32)
        for v0 in range(0, n, VB):
            v = v0 + tl.arange(0, VB)
            key = _key(tl.load(src + v, mask=v < n, other=0.0) / temperature)
            digit = ((key >> shift.to(tl.uint32)) & ((1 << (top - shift)) - 1).to(tl.uint32)).to(tl.int32)
            counts += tl.histogram(digit, 1 << DIGIT, mask=(v < n) & (_low_bits(key ^ prefix, top) == key ^ prefix))
        at_or_above = tl.sum(counts, 0) - tl.cumsum(counts, 0) + counts
        d = tl.max(tl.where(at_or_above >= want, digits, -1), 0)
        want -= tl.sum(tl.where(digits > d, counts, 0), 0)
        bucket = tl.sum(tl.where(digits == d, counts, 0), 0)
        prefix = prefix | (d.to(tl.uint32) << shift.to(tl.uint32))
        top = shift
        if (copied == 0) & (bucket <= VB) & (top > 0):  # the candidates fit a block: copied out, in any order
            # each takes its slot from a counter after the block (a scan for the slots, tl.cumsum, raised the
            # kernel's spills: Llama-3-8B b64 296 -> 384 B a thread, and greedy b64 lost 1%)
            tl.store(cands + VB, 0.0)
            tl.debug_barrier()
            for v0 in range(0, vocab, VB):
                v = v0 + tl.arange(0, VB)
                logit = tl.load(F32 + row + v, mask=v < vocab, other=0.0)
                diff = _key(logit / temperature) ^ prefix
                keep = (v < vocab) & (_low_bits(diff, top) == diff)
                slot = tl.atomic_add(cands + VB + v * 0, 1.0, mask=keep, sem="relaxed")
                tl.store(cands + slot.to(tl.int32), logit, mask=keep)
            tl.debug_barrier()  # every thread's copies are stored before any thread reads them
            src = cands
            n = bucket
            copied = 1
    bits = tl.where(prefix >= 0x80000000, prefix ^ 0x80000000, prefix ^ 0xFFFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _key(z):
    """z's bits as a uint32 that orders as z does (-0.0 just below +0.0): a positive float's sign bit set, a
    negative float's bits all flipped."""
    bits = z.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) == 1, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _low_bits(key, bits):
    """key's lowest `bits` bits (0 .. 32), the others 0 (a uint32 shifted by 32 is undefined: 0 bits is a case
    of its own)."""
    wide = bits.to(tl.uint32)
    return key & tl.where(bits == 0, 0, (0xFFFFFFFF >> (32 - tl.maximum(wide, 1))))


@triton.jit
def _bit_length(x):
    """The bits a uint32 needs: 0 for 0, else one past its highest set bit."""
    n = 0
    while (n < 32) & (_low_bits(x, n) != x):
        n += 1
    return n


@triton.jit
def _emit(I32, r, token, CONTROL: tl.constexpr, REQ_NUM_OUT: tl.constexpr, REQ_MAX_TOKENS: tl.constexpr,
          REQ_FINISHED: tl.constexpr, REQ_LAST: tl.constexpr, REQ_IGNORE_EOS: tl.constexpr,
          OUT_TOKENS: tl.constexpr, MAX_NEW: tl.constexpr, EOS_IDS: tl.constexpr):
    n = tl.load(I32 + REQ_NUM_OUT + r)
    tl.store(I32 + OUT_TOKENS + r * MAX_NEW + n, token)
    tl.store(I32 + REQ_NUM_OUT + r, n + 1)
    tl.store(I32 + REQ_LAST + r, token)
    is_eos = 0
    for i in range(tl.load(I32 + CONTROL + 5)):
        is_eos = is_eos | (tl.load(I32 + EOS_IDS + i) == token).to(tl.int32)
    at_max = (n + 1 >= tl.load(I32 + REQ_MAX_TOKENS + r)).to(tl.int32)
    stop = (is_eos * (1 - tl.load(I32 + REQ_IGNORE_EOS + r))) | at_max
    tl.store(I32 + REQ_FINISHED + r, tl.where(stop > 0, 1 + is_eos, 0))
