"""Sampling with temperature, top-k and top-p in Gluon, for the one-row loop (`step.sample`): what
codegen/bodies/schedule.py's `_sample` and the functions under it compute, the same way.

Each chunk of the vocabulary takes the Gumbel-max draw over its z = logits / temperature (token v's noise
-log(-log(u_v)), u_v Triton's `tl.rand(seed, draw * vocab + v)`: Philox-4x32 with 10 rounds, ported here as
`_rand`, so that a request's tokens are the Triton kernel's for the same seed), and the row's largest z; the last
chunk to arrive takes the first best draw and checks it against the cut (`_draw_within`): top-k by counting the
tokens above the draw or, where that cannot settle it, by the k-th largest z from a radix select (`_kth_largest`),
top-p by the mass above the draw, a rejected draw giving way to the draw over the tokens above it. Sums go in blocks
of WB logits, as the Triton body's; a sum's order within a block is this layout's, so a cut that falls within a
rounding of a sum may go the other way (never seen; the draws themselves are bit for bit).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from codegen.gluon.attention import _add

ROUNDS = gl.constexpr(10)  # Philox rounds (`triton.language.random.N_ROUNDS_DEFAULT`)
DIGIT = gl.constexpr(6)  # bits a radix-select pass decides (`_kth_largest`)


@gluon.jit
def _rand(seed, offset):
    """`tl.rand(seed, offset)` for an int32 seed and int32 offsets: uniform floats in [0, 1)."""
    c0 = offset.to(gl.uint32)
    zero = c0 * 0
    c1, c2, c3 = zero, zero, zero
    wide = gl.to_tensor(seed).to(gl.uint64)
    k0 = (wide & 0xffffffff).to(gl.uint32)
    k1 = ((wide >> 32) & 0xffffffff).to(gl.uint32)
    for _ in gl.static_range(ROUNDS):
        a0, a2 = c0, c2
        c0 = gl.umulhi(0xCD9E8D57, a2) ^ c1 ^ k0
        c2 = gl.umulhi(0xD2511F53, a0) ^ c3 ^ k1
        c1 = gl.mul(0xCD9E8D57, a2, sanitize_overflow=False)
        c3 = gl.mul(0xD2511F53, a0, sanitize_overflow=False)
        k0 = gl.add(k0, 0x9E3779B9, sanitize_overflow=False)
        k1 = gl.add(k1, 0xBB67AE85, sanitize_overflow=False)
    x = c0.to(gl.int32, bitcast=True)
    x = gl.where(x < 0, -x - 1, x)
    return x * 4.6566127342e-10


@gluon.jit
def gumbel_max(F32, row, lo, hi, vocab, VB: gl.constexpr, seed, draw, temperature, above, at_least):
    """Gumbel-max over the tokens v in lo .. hi with above < z_v and at_least <= z_v: (max of z_v + g_v, its first
    token, max of z_v over lo .. hi), as `_gumbel_max`. A block with no token in range draws no noise."""
    flat: gl.constexpr = gl.BlockedLayout([VB // (32 * gl.num_warps())], [32], [gl.num_warps()], [0])
    best_val = gl.to_tensor(float("-inf"))
    best_idx = gl.to_tensor(0)
    z_top = gl.to_tensor(float("-inf"))
    for v0 in range(lo, hi, VB):
        v = v0 + gl.arange(0, VB, layout=flat)
        z = gl.load(F32 + row + v, mask=v < hi, other=float("-inf")) / temperature
        z_top = gl.maximum(z_top, gl.max(z, axis=0))
        keep = (z > above) & (z >= at_least)
        if gl.max(keep.to(gl.int32), axis=0) > 0:
            u = _rand(seed, draw * vocab + v)
            z = gl.where(keep, z - gl.log(-gl.log(gl.maximum(u, 1e-10))), float("-inf"))
            m = gl.max(z, axis=0)
            i = gl.min(gl.where(z == m, v, 2147483647), axis=0)
            if m > best_val:
                best_val = m
                best_idx = i
    return best_val, best_idx, z_top


@gluon.jit
def _masses(F32, row, vocab, VB: gl.constexpr, temperature, z_cut, at_least, z_top):
    """The tokens with z > z_cut: how many, and their (unnormalised) probability mass; and the mass of those with
    z >= at_least, as `_masses`."""
    flat: gl.constexpr = gl.BlockedLayout([VB // (32 * gl.num_warps())], [32], [gl.num_warps()], [0])
    count = gl.to_tensor(0)
    above = gl.to_tensor(0.0)
    kept = gl.to_tensor(0.0)
    for v0 in range(0, vocab, VB):
        v = v0 + gl.arange(0, VB, layout=flat)
        z = gl.load(F32 + row + v, mask=v < vocab, other=float("-inf")) / temperature
        p = gl.exp(z - z_top)
        count += gl.sum((z > z_cut).to(gl.int32), axis=0)
        above += gl.sum(gl.where(z > z_cut, p, 0.0), axis=0)
        kept += gl.sum(gl.where(z >= at_least, p, 0.0), axis=0)
    return count, above, kept


@gluon.jit
def _key(z):
    """z's bits as a uint32 that orders as z does (`_key`)."""
    bits = z.to(gl.uint32, bitcast=True)
    return gl.where((bits >> 31) == 1, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@gluon.jit
def _low_bits(key, bits):
    """key's lowest `bits` bits (0 .. 32), the others 0 (`_low_bits`)."""
    wide = bits.to(gl.uint32)
    return key & gl.where(bits == 0, 0, (0xFFFFFFFF >> (32 - gl.maximum(wide, 1))))


@gluon.jit
def _bit_length(x):
    """The bits a uint32 needs (`_bit_length`)."""
    n = gl.to_tensor(0)
    while (n < 32) & (_low_bits(x, n) != x):
        n += 1
    return n


@gluon.jit
def kth_largest(F32, row, vocab, VB: gl.constexpr, temperature, k, z_low, z_top, cands):
    """The k-th largest z of the row, exactly, given z_low <= it and z_top the row's largest, as `_kth_largest`: a
    radix select over `_key`'s bits, DIGIT bits a pass, from the highest bit in which z_low's key and z_top's differ;
    once the keys that share the bits decided fit a block (VB), their logits are copied to `cands` (VB floats, then a
    counter) and the passes left read that block alone."""
    flat: gl.constexpr = gl.BlockedLayout([VB // (32 * gl.num_warps())], [32], [gl.num_warps()], [0])
    BINS: gl.constexpr = 1 << DIGIT
    bins: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    hi = _key(z_top)
    top = _bit_length(_key(z_low) ^ hi)  # bits still to decide
    prefix = hi ^ _low_bits(hi, top)  # the bits decided, the others 0
    want = k
    src = F32 + row
    n = vocab
    copied = gl.to_tensor(0)
    while top > 0:
        shift = gl.maximum(top - DIGIT, 0)
        digits = gl.arange(0, BINS, layout=bins)
        counts = gl.zeros([BINS], gl.int32, bins)
        for v0 in range(0, n, VB):
            v = v0 + gl.arange(0, VB, layout=flat)
            key = _key(gl.load(src + v, mask=v < n, other=0.0) / temperature)
            digit = ((key >> shift.to(gl.uint32)) & ((1 << (top - shift)) - 1).to(gl.uint32)).to(gl.int32)
            same = (v < n) & (_low_bits(key ^ prefix, top) == key ^ prefix)
            counts += gl.histogram(digit, BINS, mask=same, layout=bins)
        at_or_above = gl.sum(counts, axis=0) - gl.associative_scan(counts, 0, _add) + counts
        d = gl.max(gl.where(at_or_above >= want, digits, -1), axis=0)
        want -= gl.sum(gl.where(digits > d, counts, 0), axis=0)
        bucket = gl.sum(gl.where(digits == d, counts, 0), axis=0)
        prefix = prefix | (d.to(gl.uint32) << shift.to(gl.uint32))
        top = shift
        if (copied == 0) & (bucket <= VB) & (top > 0):  # the candidates fit a block: copied out, in any order
            gl.store(cands + VB, 0.0)
            gl.thread_barrier()
            for v0 in range(0, vocab, VB):
                v = v0 + gl.arange(0, VB, layout=flat)
                logit = gl.load(F32 + row + v, mask=v < vocab, other=0.0)
                diff = _key(logit / temperature) ^ prefix
                keep = (v < vocab) & (_low_bits(diff, top) == diff)
                slot = gl.atomic_add(cands + VB + v * 0, gl.full_like(logit, 1.0), mask=keep, sem="relaxed")
                gl.store(cands + slot.to(gl.int32), logit, mask=keep)
            gl.thread_barrier()  # every thread's copies are stored before any thread reads them
            src = cands
            n = bucket
            copied = gl.to_tensor(1)
    bits = gl.where(prefix >= 0x80000000, prefix ^ 0x80000000, prefix ^ 0xFFFFFFFF)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def draw_within(F32, row, vocab, VB: gl.constexpr, NB: gl.constexpr, seed, draw, temperature, top_k, top_p, token,
                z_top, cands):
    """The Gumbel-max draw over the tokens that survive top-k and then top-p, given `token`, the draw over the whole
    row, as `_draw_within` (passes over the row in blocks of VB, redraws in blocks of NB)."""
    at_least = gl.to_tensor(float("-inf"))
    z = gl.load(F32 + row + token) / temperature
    above = gl.to_tensor(float("-inf"))
    settled = gl.to_tensor(False)
    redraw = gl.to_tensor(False)
    if (top_k > 0) & (top_k < vocab):
        count, mass, from_draw = _masses(F32, row, vocab, VB, temperature, z, z, z_top)
        settled = (count < top_k) & ((top_p >= 1.0) | (mass < top_p * from_draw))
        if not settled:
            z_low = gl.where(count >= top_k, z, float("-inf"))
            at_least = kth_largest(F32, row, vocab, VB, temperature, top_k, z_low, z_top, cands)
            redraw = z < at_least
    if (not settled) & (not redraw) & (top_p < 1.0):
        _, mass, kept = _masses(F32, row, vocab, VB, temperature, z, at_least, z_top)
        redraw = mass >= top_p * kept
        above = z
    while redraw:
        token = gumbel_max(F32, row, 0, vocab, vocab, NB, seed, draw, temperature, above, at_least)[1]
        z = gl.load(F32 + row + token) / temperature
        redraw = gl.to_tensor(False)
        if top_p < 1.0:
            _, mass, kept = _masses(F32, row, vocab, VB, temperature, z, at_least, z_top)
            redraw = mass >= top_p * kept
            above = z
    return token
