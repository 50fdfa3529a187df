"""blinkc.engine.ReferenceEngine: continuous batching must not change what each request generates.

Greedy outputs of requests generated together, in chunks, or with preemption (a KV pool too small for
all of them) must equal each request generated alone; stop rules and request checks are exercised too.
"""
from __future__ import annotations

import pytest
import torch

from blinkc.engine import EngineConfig, ReferenceEngine
from blinkc.weights import load_weights
from models.trace import trace_model
from runtime.sampling import SamplingParams
from tests.conftest import fp32_model

PAGE_SIZE = 4
PROMPT_LENGTHS = (7, 11, 3, 9)
MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)


@pytest.fixture(scope="module")
def model(checkpoint):
    """(graph, weights) of the tiny Llama in fp32 with pages of 4 tokens."""
    directory = checkpoint("tiny-llama")
    resolved = fp32_model(directory)
    graph = trace_model(resolved.definition, resolved.config, page_size=PAGE_SIZE)
    return graph, load_weights(graph, directory)


@pytest.fixture(scope="module")
def prompts(model):
    vocab = model[1]["model.embed_tokens.weight"].shape[0]
    return [torch.randint(0, vocab - 16, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def alone(model, prompts):
    """Greedy outputs of each prompt generated on its own engine."""
    return [_engine(model).generate([p], GREEDY)[0] for p in prompts]


def _engine(model, eos_token_ids=(), **config) -> ReferenceEngine:
    graph, weights = model
    return ReferenceEngine(graph, weights, eos_token_ids=eos_token_ids, config=EngineConfig(**config))


def _run(engine: ReferenceEngine, prompts, params=GREEDY):
    """Runs to completion; returns (requests, most requests advanced in one step, preemptions seen).

    A preemption shows as a request whose cached token count went down between two steps."""
    requests = [engine.add_request(p, params) for p in prompts]
    num_preempted, widest = 0, 0
    with torch.inference_mode():
        while engine.has_work():
            before = [r.num_cached for r in requests]
            widest = max(widest, len(engine.step().logits))
            num_preempted += sum(r.num_cached < n for r, n in zip(requests, before))
    return requests, widest, num_preempted


def _assert_same_outputs(requests, expected) -> None:
    for i, (request, tokens) in enumerate(zip(requests, expected)):
        first_diff = next((j for j, (a, b) in enumerate(zip(request.output, tokens)) if a != b), None)
        assert request.output == tokens, (f"request {i}: first differing token at index {first_diff}: "
                                          f"{request.output} vs alone {tokens}")


def _assert_all_pages_free(engine: ReferenceEngine) -> None:
    num_pages = engine.config.num_pages
    assert engine.pool.num_free == num_pages
    assert sorted(engine.pool.allocate(num_pages)) == list(range(num_pages)), "a page was freed twice"


def _first_new_token(tokens: list[int]) -> int:
    """The first index k > 0 whose token did not occur before it."""
    return next(k for k in range(1, len(tokens)) if tokens[k] not in tokens[:k])


def test_batched_equals_alone(model, prompts, alone):
    engine = _engine(model)
    requests, widest, _ = _run(engine, prompts)
    assert widest == len(prompts), "all requests should share steps"
    _assert_same_outputs(requests, alone)
    assert all(r.finish_reason == "length" and len(r.output) == MAX_TOKENS for r in requests)
    _assert_all_pages_free(engine)


def test_chunked_prefill_equals_unchunked(model, prompts, alone):
    engine = _engine(model, max_num_batched_tokens=5)
    requests, _, _ = _run(engine, prompts)
    _assert_same_outputs(requests, alone)
    _assert_all_pages_free(engine)


def test_preemption_keeps_outputs_and_returns_every_page(model, prompts, alone):
    engine = _engine(model, num_pages=6)  # the longest request alone needs 5 pages of 4 tokens
    requests, _, num_preempted = _run(engine, prompts)
    assert num_preempted >= 2, f"only {num_preempted} preemptions"
    _assert_same_outputs(requests, alone)
    _assert_all_pages_free(engine)


def test_preemption_with_chunked_prefill(model, prompts, alone):
    engine = _engine(model, num_pages=6, max_num_batched_tokens=5)
    requests, _, _ = _run(engine, prompts)
    _assert_same_outputs(requests, alone)
    _assert_all_pages_free(engine)


def test_stops_at_eos(model, prompts, alone):
    k = _first_new_token(alone[1])
    engine = _engine(model, eos_token_ids=(alone[1][k],))
    (request,), _, _ = _run(engine, [prompts[1]])
    assert request.finish_reason == "stop"
    assert request.output == alone[1][: k + 1]
    _assert_all_pages_free(engine)


def test_stops_at_stop_token_ids_even_when_ignoring_eos(model, prompts, alone):
    k = _first_new_token(alone[2])
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop_token_ids=(alone[2][k],), ignore_eos=True)
    (request,), _, _ = _run(_engine(model), [prompts[2]], params)
    assert request.finish_reason == "stop"
    assert request.output == alone[2][: k + 1]


def test_ignore_eos(model, prompts, alone):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    (request,), _, _ = _run(_engine(model, eos_token_ids=(alone[0][0],)), [prompts[0]], params)
    assert request.finish_reason == "length"
    assert request.output == alone[0]


def test_request_checks(model, prompts):
    engine = _engine(model, max_model_len=len(prompts[0]) + MAX_TOKENS)
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match=r"prompt \(7\) \+ max_tokens \(11\) exceeds max_model_len \(17\)"):
        engine.add_request(prompts[0], SamplingParams(max_tokens=MAX_TOKENS + 1, temperature=0))
    assert not engine.has_work()
    engine.add_request(prompts[0], GREEDY)  # exactly max_model_len is allowed


@pytest.mark.parametrize("name", ["num_pages", "max_num_batched_tokens", "max_num_seqs", "max_model_len"])
def test_engine_config_must_be_positive(name):
    with pytest.raises(ValueError, match=f"{name} must be positive"):
        EngineConfig(**{name: 0})


def test_seeded_sampling_is_reproducible(model, prompts):
    params = SamplingParams(max_tokens=8, temperature=1.0, top_k=40, seed=1234)
    first = _engine(model).generate(prompts[:3], params)
    again = _engine(model).generate(prompts[:3], params)
    assert first == again
    assert [_engine(model).generate([p], params)[0] for p in prompts[:3]] == first, "batching changed samples"
    other = _engine(model).generate(prompts[:3], SamplingParams(max_tokens=8, temperature=1.0, top_k=40, seed=99))
    assert other != first
