"""The step planner (program 0, at the start of every step) and the sampler (one task per sequence).

The planner turns request state into the step's inputs: each unfinished request brings its next prompt
chunk (within the step's token budget) or its last sampled token; it writes token ids, positions, cache
slots (from the request's pages), the sequences' extents, and zeroes the norm statistics. When no request
is left it sets `done`. The sampler picks each finished chunk's next token on the GPU: greedy, or Gumbel-max
over temperature-scaled logits restricted by top-k and top-p, with a per-request seed.
"""
import triton
import triton.language as tl

from codegen.bodies.common import arrives_last

SAMPLE_FIELDS = ("logits_off", "vocab", "splits", "part_off", "ticket_off")


@triton.jit
def plan_step(I32, F32, step, CONTROL: tl.constexpr, INPUT_IDS: tl.constexpr, POSITIONS: tl.constexpr,
              SLOTS: tl.constexpr, SEQ_STARTS: tl.constexpr, CONTEXT_LENS: tl.constexpr, SEQ_REQ: tl.constexpr,
              LOGITS_ROWS: tl.constexpr, SEQ_FINAL: tl.constexpr, REQ_PROMPT_OFF: tl.constexpr,
              REQ_PROMPT_LEN: tl.constexpr, REQ_CACHED: tl.constexpr, REQ_FINISHED: tl.constexpr,
              REQ_LAST: tl.constexpr, REQ_PAGES: tl.constexpr, PROMPTS: tl.constexpr,
              PAGES_PER_SEQ: tl.constexpr, PAGE_SIZE: tl.constexpr, MAX_TOKENS: tl.constexpr,
              STATS_OFF: tl.constexpr, STATS_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    for z in range(0, STATS_SIZE, CHUNK):
        zs = z + tl.arange(0, CHUNK)
        tl.store(F32 + STATS_OFF + zs, tl.zeros((CHUNK,), tl.float32), mask=zs < STATS_SIZE)
    num_requests = tl.load(I32 + CONTROL + 4)
    t = 0
    b = 0
    active = 0
    for r in range(num_requests):
        if tl.load(I32 + REQ_FINISHED + r) == 0:
            active += 1
            cached = tl.load(I32 + REQ_CACHED + r)
            prompt_len = tl.load(I32 + REQ_PROMPT_LEN + r)
            n = tl.minimum(tl.maximum(prompt_len - cached, 1), MAX_TOKENS - t)
            if n > 0:
                offs = tl.arange(0, CHUNK)
                for c in range(0, n, CHUNK):
                    i = c + offs
                    ok = i < n
                    pos = cached + i
                    from_prompt = tl.load(I32 + PROMPTS + tl.load(I32 + REQ_PROMPT_OFF + r) + pos,
                                          mask=ok & (pos < prompt_len), other=0)
                    token = tl.where(pos < prompt_len, from_prompt, tl.load(I32 + REQ_LAST + r))
                    page = tl.load(I32 + REQ_PAGES + r * PAGES_PER_SEQ + pos // PAGE_SIZE, mask=ok, other=0)
                    tl.store(I32 + INPUT_IDS + t + i, token, mask=ok)
                    tl.store(I32 + POSITIONS + t + i, pos, mask=ok)
                    tl.store(I32 + SLOTS + t + i, page * PAGE_SIZE + pos % PAGE_SIZE, mask=ok)
                tl.store(I32 + SEQ_STARTS + b, t)
                tl.store(I32 + CONTEXT_LENS + b, cached + n)
                tl.store(I32 + SEQ_REQ + b, r)
                tl.store(I32 + LOGITS_ROWS + b, t + n - 1)
                tl.store(I32 + SEQ_FINAL + b, (cached + n >= prompt_len).to(tl.int32))
                tl.store(I32 + REQ_CACHED + r, cached + n)
                t += n
                b += 1
    tl.store(I32 + SEQ_STARTS + b, t)
    tl.store(I32 + CONTROL + 0, t)
    tl.store(I32 + CONTROL + 1, b)
    tl.store(I32 + CONTROL + 2, (active == 0).to(tl.int32))
    tl.store(I32 + CONTROL + 3, step)


@triton.jit
def sample_task(desc, tile, I32, F32, num_seqs, step, CONTROL: tl.constexpr, SEQ_REQ: tl.constexpr,
                SEQ_FINAL: tl.constexpr, REQ_NUM_OUT: tl.constexpr, REQ_MAX_TOKENS: tl.constexpr,
                REQ_FINISHED: tl.constexpr, REQ_LAST: tl.constexpr, REQ_SEED: tl.constexpr,
                REQ_TOP_K: tl.constexpr, REQ_IGNORE_EOS: tl.constexpr, REQ_TEMPERATURE: tl.constexpr,
                REQ_TOP_P: tl.constexpr, OUT_TOKENS: tl.constexpr, MAX_NEW: tl.constexpr, EOS_IDS: tl.constexpr,
                VB: tl.constexpr):
    """Task (sequence, vocabulary chunk). Greedy: each chunk's argmax, the last chunk to finish picks the
    first maximum in order and emits. Sampling (thresholds need the whole row): chunk 0 does it all."""
    logits_off, vocab = tl.load(desc + 0), tl.load(desc + 1).to(tl.int32)
    splits, part_off, ticket_off = tl.load(desc + 2), tl.load(desc + 3), tl.load(desc + 4)
    b = tile // splits
    chunk = tile % splits
    if b < num_seqs:
        if tl.load(I32 + SEQ_FINAL + b) == 1:
            r = tl.load(I32 + SEQ_REQ + b)
            row = logits_off + b * vocab
            temperature = tl.load(F32 + REQ_TEMPERATURE + r)
            token = -1
            if temperature == 0.0:
                width = tl.cdiv(tl.cdiv(vocab, splits), VB) * VB
                lo = (chunk * width).to(tl.int32)
                best, index = _argmax(F32, row, lo, tl.minimum(vocab, lo + width), VB, 0, 0, 1.0, 0.0, False)
                if splits == 1:
                    token = index
                else:
                    part = F32 + part_off + b * splits * 2
                    tl.store(part + chunk * 2, best)
                    tl.store(part + chunk * 2 + 1, index.to(tl.float32))
                    if arrives_last(F32 + ticket_off + b, splits):
                        token = _first_max(part, splits)
            elif chunk == 0:
                token = _pick(F32, row, vocab, temperature, tl.load(F32 + REQ_TOP_P + r), tl.load(I32 + REQ_TOP_K + r),
                              tl.load(I32 + REQ_SEED + r), tl.load(I32 + REQ_NUM_OUT + r), VB)
            if token >= 0:
                _emit(I32, r, token, CONTROL, REQ_NUM_OUT, REQ_MAX_TOKENS, REQ_FINISHED, REQ_LAST, REQ_IGNORE_EOS,
                      OUT_TOKENS, MAX_NEW, EOS_IDS)


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
def _argmax(F32, row, lo, hi, VB: tl.constexpr, noise_seed, noise_index, temperature, cut, use_noise):
    """(max, argmax) over v in lo .. hi of z_v (+ Gumbel noise) among z_v >= cut, z = logits / temperature."""
    best_val = float("-inf")
    best_idx = 0
    for v0 in range(lo, hi, VB):
        v = v0 + tl.arange(0, VB)
        z = tl.load(F32 + row + v, mask=v < hi, other=float("-inf")) / temperature
        if use_noise:
            u = tl.rand(noise_seed, noise_index * hi + v)
            z = tl.where(z >= cut, z - tl.log(-tl.log(tl.maximum(u, 1e-10))), float("-inf"))
        m = tl.max(z, 0)
        i = tl.argmax(z, 0)
        if m > best_val:
            best_val = m
            best_idx = (v0 + i).to(tl.int32)
    return best_val, best_idx


@triton.jit
def _pick(F32, row, vocab, temperature, top_p, top_k, seed, index, VB: tl.constexpr):
    if temperature == 0.0:
        return _argmax(F32, row, 0, vocab, VB, seed, index, 1.0, 0.0, False)[1]
    z_max = float("-inf")
    z_min = float("inf")
    for v0 in range(0, vocab, VB):
        v = v0 + tl.arange(0, VB)
        z = tl.load(F32 + row + v, mask=v < vocab, other=float("-inf")) / temperature
        z_max = tl.maximum(z_max, tl.max(z, 0))
        z_min = tl.minimum(z_min, tl.min(tl.where(v < vocab, z, float("inf")), 0))
    cut = z_min
    if top_k > 0:
        if top_k < vocab:
            cut = _bisect_count(F32, row, vocab, temperature, top_k, z_min, z_max, VB)
    if top_p < 1.0:
        cut = tl.maximum(cut, _bisect_mass(F32, row, vocab, temperature, top_p, cut, z_max, VB))
    return _argmax(F32, row, 0, vocab, VB, seed, index, temperature, cut, True)[1]


@triton.jit
def _bisect_count(F32, row, vocab, temperature, k, lo, hi, VB: tl.constexpr):
    """Largest cut with count(z >= cut) >= k: the top-k survivors (ties at the k-th value survive)."""
    for _ in range(40):
        mid = (lo + hi) * 0.5
        count = 0
        for v0 in range(0, vocab, VB):
            v = v0 + tl.arange(0, VB)
            z = tl.load(F32 + row + v, mask=v < vocab, other=float("-inf")) / temperature
            count += tl.sum((z >= mid).to(tl.int32), 0)
        if count >= k:
            lo = mid
        else:
            hi = mid
    return lo


@triton.jit
def _bisect_mass(F32, row, vocab, temperature, p, lo, hi, VB: tl.constexpr):
    """Largest cut whose survivors (z >= cut, among z >= lo) hold at least p of the probability: the
    smallest nucleus."""
    total = 0.0
    for v0 in range(0, vocab, VB):
        v = v0 + tl.arange(0, VB)
        z = tl.load(F32 + row + v, mask=v < vocab, other=float("-inf")) / temperature
        total += tl.sum(tl.where(z >= lo, tl.exp(z - hi), 0.0), 0)
    for _ in range(40):
        mid = (lo + hi) * 0.5
        mass = 0.0
        for v0 in range(0, vocab, VB):
            v = v0 + tl.arange(0, VB)
            z = tl.load(F32 + row + v, mask=v < vocab, other=float("-inf")) / temperature
            mass += tl.sum(tl.where(z >= mid, tl.exp(z - hi), 0.0), 0)
        if mass >= p * total:
            lo = mid
        else:
            hi = mid
    return lo


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
