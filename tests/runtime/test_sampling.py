"""runtime.sampling: SamplingParams checks and the host sampler's greedy / temperature / top-k / top-p rules."""
from __future__ import annotations

import math

import pytest
import torch

from runtime.sampling import SamplingParams, sample

LOGITS = torch.tensor([0.3, 2.1, -1.0, 1.7, 0.9, -0.2, 1.2])  # argmax 1, runner-up 3
NUM_DRAWS = 4000


def _draws(logits: torch.Tensor, params: SamplingParams, num: int = NUM_DRAWS, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [sample(logits, params, generator) for _ in range(num)]


@pytest.mark.parametrize("fields, message", [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
])
def test_invalid_params(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_nan_temperature_is_rejected():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=float("nan"))


def test_greedy_is_argmax():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(37, generator=g)
        assert sample(logits, SamplingParams(temperature=0), None) == int(logits.argmax())
    assert SamplingParams(temperature=0).is_greedy and not SamplingParams().is_greedy


@pytest.mark.parametrize("temperature", [0.3, 1.0, 7.0])
def test_top_k_one_is_greedy_at_any_temperature(temperature):
    assert set(_draws(LOGITS, SamplingParams(temperature=temperature, top_k=1), num=200)) == {1}


def test_tiny_top_p_is_greedy():
    assert set(_draws(LOGITS, SamplingParams(temperature=2.0, top_p=1e-4), num=200)) == {1}


def test_same_seed_repeats_and_other_seeds_differ():
    params = SamplingParams(temperature=1.5)
    first, again, other = (_draws(LOGITS, params, num=50, seed=s) for s in (11, 11, 12))
    assert first == again
    assert first != other


def test_temperature_one_matches_softmax():
    logits = torch.tensor([1.0, -0.5, 0.2, 2.0, 0.0])
    draws = torch.tensor(_draws(logits, SamplingParams(temperature=1.0)))
    observed = torch.bincount(draws, minlength=5).double() / NUM_DRAWS
    expected = logits.double().softmax(-1)
    worst = float((observed - expected).abs().max())
    assert worst < 0.03, f"empirical {observed.tolist()} vs softmax {expected.tolist()}"


def test_temperature_sharpens_and_flattens():
    hot, cold = (torch.tensor(_draws(LOGITS, SamplingParams(temperature=t), num=2000)) for t in (4.0, 0.25))
    assert (cold == 1).float().mean() > 0.75 > (hot == 1).float().mean()


def test_top_k_two_stays_in_the_top_two():
    draws = _draws(LOGITS, SamplingParams(temperature=3.0, top_k=2), num=1000)
    assert set(draws) == {1, 3}


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    draws = torch.tensor(_draws(logits, SamplingParams(temperature=1.0, top_p=0.7), num=2000))
    assert set(draws.tolist()) == {0, 1}
    share = float((draws == 0).double().mean())
    assert math.isclose(share, 0.5 / 0.8, abs_tol=0.04), f"token 0 drawn {share:.3f} of the time, expected 0.625"
