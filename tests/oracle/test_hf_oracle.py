"""HF transformers (someone else's implementation) ≈ our reference executor, for all four families.

A random checkpoint is loaded by both. Scenario: one step prefills three prompts of different lengths,
then at least 8 steps decode while new requests join (their prefill mixed into decode steps) and others
finish. Every logits row of every step is compared with transformers' fp32 logits at the same position.
Then greedy generation of 32 tokens for a batch must give HF `generate`'s tokens exactly.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from blinkc.engine import EngineConfig, ReferenceEngine
from blinkc.weights import load_weights
from models.presets import TINY_PRESETS
from models.trace import trace_model
from runtime.sampling import SamplingParams
from tests.conftest import assert_close, fp32_model

PROMPT_LENGTHS = (7, 13, 3)
JOINING = {2: 5, 4: 9, 6: 1}  # step index -> prompt length of a request that joins then
MAX_TOKENS = (3, 12, 6, 5, 4, 3)


def _prompt(n: int, salt: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(1000 * salt + n)
    return torch.randint(0, vocab - 16, (n,), generator=g).tolist()


def _engine(checkpoint_dir, page_size=4, **config):
    model = fp32_model(checkpoint_dir)
    graph = trace_model(model.definition, model.config, page_size=page_size)
    return ReferenceEngine(graph, load_weights(graph, checkpoint_dir), config=EngineConfig(**config)), model


def _hf(checkpoint_dir):
    model, info = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), f"HF loading problems: {info}"
    return model.eval()


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_mixed_steps_match_transformers_logits(preset, checkpoint):
    directory = checkpoint(preset)
    engine, model = _engine(directory)
    hf = _hf(directory)
    vocab = model.config.vocab_size
    requests = [engine.add_request(_prompt(n, i, vocab), SamplingParams(max_tokens=MAX_TOKENS[i], temperature=0),
                                   wants_all_logits=True) for i, n in enumerate(PROMPT_LENGTHS)]
    worst, step, num_mixed = 0.0, 0, 0
    with torch.inference_mode():
        while engine.has_work():
            if step in JOINING:
                i = len(requests)
                requests.append(engine.add_request(_prompt(JOINING[step], i, vocab),
                                                   SamplingParams(max_tokens=MAX_TOKENS[i], temperature=0),
                                                   wants_all_logits=True))
            before = {r.id: r.num_cached for r in requests}
            result = engine.step()
            num_mixed += len({len(rows) > 1 for rows in result.logits.values()}) > 1
            for r in requests:
                if r.id not in result.logits:
                    continue
                rows = result.logits[r.id]
                expected = hf(torch.tensor([r.tokens[: r.num_cached]])).logits[0, before[r.id]:r.num_cached]
                worst = max(worst, assert_close(rows, expected, torch.float32))
            step += 1
    assert step >= 9 and num_mixed >= 2, f"scenario too short: {step} steps, {num_mixed} mixed"
    assert all(r.finish_reason == "length" and len(r.output) == r.params.max_tokens for r in requests)
    print(f"\n{preset}: {step} steps, largest relative error vs transformers {worst:.3g}")


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_greedy_tokens_match_transformers_generate(preset, checkpoint):
    directory = checkpoint(preset)
    engine, model = _engine(directory, page_size=8)
    hf = _hf(directory)
    prompts = [_prompt(n, 50 + n, model.config.vocab_size) for n in (4, 11, 6)]
    ours = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0))
    greedy = GenerationConfig(do_sample=False, max_new_tokens=32, min_new_tokens=0, eos_token_id=None,
                              pad_token_id=0)
    for prompt, tokens in zip(prompts, ours):
        with torch.inference_mode():
            theirs = hf.generate(torch.tensor([prompt]), generation_config=greedy)[0, len(prompt):].tolist()
        first_diff = next((i for i, (a, b) in enumerate(zip(tokens, theirs)) if a != b), None)
        assert first_diff is None and len(tokens) == len(theirs) == 32, \
            f"first differing token at index {first_diff}: ours {tokens} vs HF {theirs}"
