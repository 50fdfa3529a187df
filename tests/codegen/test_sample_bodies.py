"""The sampler's pieces (codegen/bodies/schedule.py) alone under TRITON_INTERPRET=1: the radix select against
torch.topk, and seeded draws under top-k and top-p against the same Gumbel-max draw over the kept set that
runtime.sampling.probabilities defines. The same tests run compiled where a GPU is (marked `gpu`)."""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from codegen.bodies.schedule import _argmax, _draw_within, _first_max, _gumbel_max, _kth_largest, _largest
from runtime.sampling import SamplingParams, probabilities

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = [pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                 reason="needs the interpreter or a GPU"),
              *([] if INTERPRET else [pytest.mark.gpu])]

VB = 64  # smaller than the rows below, so that every loop crosses blocks and ends on a partial one


@triton.jit
def _kth_kernel(F32, LOW, CANDS, OUT, vocab, temperature, k, VB: tl.constexpr):
    """Row i's k[i]-th largest z, given a lower bound LOW[i] (a logit) and the row's largest z."""
    i = tl.program_id(0)
    z_top = _gumbel_max(F32, i * vocab, 0, vocab, vocab, VB, 0, 0, temperature, float("inf"), float("inf"))[2]
    z_low = tl.load(LOW + i) / temperature
    tl.store(OUT + i, _kth_largest(F32, i * vocab, vocab, VB, temperature, tl.load(k + i), z_low, z_top,
                                   CANDS + i * (VB + 1)))


@triton.jit
def _draw_kernel(F32, CANDS, OUT, vocab, seed, num_draws, temperature, top_k, top_p, cut, VB: tl.constexpr):
    """Draw i with the sampler (the whole row's draw, then the cut), beside it the draw over the tokens with
    z >= cut alone, and the whole row's draw."""
    for i in range(num_draws):
        best, token, z_top = _gumbel_max(F32, 0, 0, vocab, vocab, VB, seed, i, temperature, float("-inf"),
                                         float("-inf"))
        tl.store(OUT + 3 * i, _draw_within(F32, 0, vocab, VB, VB // 2, seed, i, temperature, top_k, top_p, token, z_top,
                                           CANDS))
        tl.store(OUT + 3 * i + 1, _gumbel_max(F32, 0, 0, vocab, vocab, VB, seed, i, temperature, float("-inf"),
                                              cut)[1])
        tl.store(OUT + 3 * i + 2, token)


@triton.jit
def _argmax_kernel(F32, OUT, vocab, lo, hi, VB: tl.constexpr):
    """Row i's (max, first argmax) over its logits lo .. hi."""
    i = tl.program_id(0)
    best, index = _argmax(F32, i * vocab, lo, hi, VB)
    tl.store(OUT + 2 * i, best)
    tl.store(OUT + 2 * i + 1, index.to(tl.float32))


def test_greedy_takes_the_first_of_equal_maxima():
    """The first index of the largest logit in lo .. hi, as torch.argmax: ties within a block, across blocks and
    at the same place of two blocks; a maximum in the last, partial block; logits past hi larger still."""
    vocab, lo, hi = 300, 10, 237  # blocks of VB from lo; the last one partial
    rows = (torch.randn(6, vocab, generator=torch.Generator().manual_seed(2)) * 3).round()
    rows[:, hi:] = 100.0  # past hi: never taken
    rows[1, [40, 41, 200]] = 50.0  # ties in a block and a later one
    rows[2, [20, 20 + VB]] = 50.0  # ties at the same place of two blocks
    rows[3, 236] = 50.0  # the last, partial block
    rows[4, lo:hi] = -7.0  # every logit alike
    rows[5, 150] = float("inf")
    out = torch.zeros(len(rows), 2, device=DEVICE)
    _argmax_kernel[(len(rows),)](rows.flatten().to(DEVICE), out, vocab, lo, hi, VB)
    window = rows[:, lo:hi]
    assert out[:, 0].cpu().tolist() == window.max(1).values.tolist()
    assert out[:, 1].cpu().long().tolist() == (window.argmax(1) + lo).tolist()


@triton.jit
def _parts_kernel(PARTS, OUT, splits):
    """Row i's chunk partials (max, token) -> the first best chunk's token and the largest maximum."""
    i = tl.program_id(0)
    tl.store(OUT + 2 * i, _first_max(PARTS + i * splits * 2, splits).to(tl.float32))
    tl.store(OUT + 2 * i + 1, _largest(PARTS + i * splits * 2, splits * 2))


@pytest.mark.parametrize("splits", [5, 40])
def test_the_first_chunk_with_the_largest_maximum_gives_the_token(splits):
    """`_first_max` over the chunks' (max, token) pairs: the earliest of equal maxima, the last chunk's, every
    chunk alike; `_largest` over all the words."""
    generator = torch.Generator().manual_seed(3)
    values = (torch.randn(4, splits, generator=generator) * 2).round()
    values[1, [1, splits - 1]] = 9.0  # a tie: the first chunk's token
    values[2, splits - 1] = 9.0  # the last chunk
    values[3, :] = -4.0  # every chunk alike
    tokens = torch.arange(4 * splits, dtype=torch.float32).reshape(4, splits) * 7 + 3
    parts = torch.stack([values, tokens], 2).flatten()
    out = torch.zeros(4, 2, device=DEVICE)
    _parts_kernel[(4,)](parts.to(DEVICE), out, splits)
    assert out[:, 0].cpu().long().tolist() == tokens.gather(1, values.argmax(1, keepdim=True))[:, 0].long().tolist()
    assert out[:, 1].cpu().tolist() == torch.stack([values, tokens], 2).flatten(1).max(1).values.tolist()


def test_the_radix_select_finds_the_kth_largest_exactly():
    """Against torch.topk, from no lower bound and from bounds at and below the answer; rows where the
    candidates fit the scratch block after a pass or two, and rows where they never do (one value 150 times)."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.stack([torch.randn(150, generator=generator) * 4,  # both signs
                        torch.randn(150, generator=generator).abs() + 1e3,  # one sign, one exponent
                        (torch.randn(150, generator=generator) * 3).round(),  # ties
                        -torch.rand(150, generator=generator) * 1e-30,  # tiny negatives
                        torch.full((150,), -2.5)])  # every key alike: no pass narrows the candidates
    ks = torch.tensor([1, 17, 75, 149, 40], dtype=torch.int32)
    copied = 0
    for temperature in (1.0, 0.5):  # exact on the GPU too, whose division may round
        for rolled in range(len(rows)):
            k = ks.roll(rolled)
            ranked = [rows[i].topk(int(k[i])).values for i in range(len(rows))]
            expected = torch.stack([r[-1] for r in ranked]) / temperature
            for low in (torch.full((len(rows),), float("-inf")),  # no bound
                        torch.stack([r[-1] for r in ranked]),  # the answer itself
                        torch.stack([rows[i].topk(min(150, int(k[i]) + 9)).values[-1] for i in range(len(rows))])):
                out = torch.zeros(len(rows), device=DEVICE)
                cands = torch.zeros(len(rows), VB + 1, device=DEVICE)  # each row's copies, then their counter
                _kth_kernel[(len(rows),)](rows.flatten().to(DEVICE), low.to(DEVICE), cands, out, 150, temperature,
                                          k.to(DEVICE), VB)
                assert out.cpu().tolist() == expected.tolist()
                copies = cands[:, VB].cpu()
                assert copies[4] == 0  # the row of one value never narrows
                copied += int((copies > 0).sum())
    assert copied > 0  # and the others mostly finish on their copies


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=0.7, top_p=0.6),
    SamplingParams(temperature=1.0, top_p=0.05),  # the nucleus is the top token alone
    SamplingParams(temperature=2.0, top_k=30, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=100, top_p=0.999),
    SamplingParams(temperature=0.3, top_k=20, top_p=0.9),  # peaked: most draws are settled by one count pass
], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_a_draw_under_a_cut_is_the_draw_over_the_kept_tokens(params):
    """The same noise drawn over the kept set alone picks the same token every time, every token drawn is
    kept, and the draws follow the reference distribution."""
    vocab, num_draws = 100, 200
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 2
    expected = probabilities(logits, params)
    z = logits / params.temperature  # the cut halfway to the next token down: the GPU's division may round
    cut = float((z[expected > 0].min() + z[expected == 0].max()) / 2) if bool((expected == 0).any()) else -1e30
    out = torch.zeros(3 * num_draws, dtype=torch.int32, device=DEVICE)
    _draw_kernel[(1,)](logits.to(DEVICE), torch.zeros(VB + 1, device=DEVICE), out, vocab, 7, num_draws,
                       params.temperature, params.top_k, params.top_p, cut, VB)
    host = out.cpu()
    drawn, within, whole = host[0::3], host[1::3], host[2::3]
    assert drawn.tolist() == within.tolist()
    print(f"the whole row's draw kept {int((drawn == whole).sum())} times of {num_draws}")
    assert bool((expected[drawn.long()] > 0).all())
    observed = torch.bincount(drawn.long(), minlength=vocab).double() / num_draws
    spread = float((2 * expected * (1 - expected) / (torch.pi * num_draws)).sqrt().sum()) / 2
    distance = float((observed - expected.double()).abs().sum()) / 2
    print(f"total variation {distance:.3f}, expected from the draws' own noise ~{spread:.3f}")
    assert distance <= 2 * spread + 0.01
