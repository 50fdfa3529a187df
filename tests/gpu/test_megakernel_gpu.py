"""The megakernel on the GPU ≈ the reference executor on the GPU (same weights, bf16), full-size models.

The prefill step's logits and the logits of a later decode step (teacher-forced on the kernel's own
tokens) must match the reference within bf16 tolerance.
"""
from __future__ import annotations

import pytest
import torch

from blinkc.compile_model import WeightsSource, build_graph, compile_model
from codegen.config import CompileConfig
from ir.executor import execute
from models.registry import resolve_model
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams
from runtime.step import SeqChunk, build_step
from tests.conftest import assert_close

CASES = [("llama3-8b", 1), ("llama3-8b", 8), ("llama3-8b", 64), ("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 8),
         ("qwen3-30b-a3b", 64), ("phi-4", 1), ("qwen3-32b", 1)]


def reference_logits(model, kernel: Megakernel, sequences: list[list[int]]) -> torch.Tensor:
    """Last-token logits of each sequence, prefilled in one step by the reference executor on the GPU
    (running the same optimised graph the kernel was lowered from; passes are checked on the CPU)."""
    graph = build_graph(model, CompileConfig())
    pages, chunks, next_page = [], [], 0
    for tokens in sequences:
        n = -(-len(tokens) // 16)
        chunks.append(SeqChunk(tokens, 0, list(range(next_page, next_page + n))))
        next_page += n
    inputs = build_step(chunks, 16, "cuda")
    cfg = model.config
    for i in range(cfg.num_hidden_layers):
        inputs[f"kv_cache.{i}"] = torch.zeros(2, next_page, 16, cfg.num_key_value_heads, cfg.head_dim,
                                              dtype=torch.bfloat16, device="cuda")
    params = {p.name: kernel.weight_views[p.name] for p in graph.params}
    with torch.inference_mode():
        return execute(graph, params, inputs)["logits"]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("preset,batch", CASES)
def test_megakernel_matches_reference_on_gpu(preset, batch, tmp_path):
    model = resolve_model(preset)
    config = CompileConfig(max_batch=batch, max_tokens_per_step=max(256, 40 * batch), max_model_len=512,
                           max_new_tokens=8)
    out = compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path
    kernel = Megakernel.load(out, device="cuda", timeout_s=300)
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, model.config.vocab_size, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 40, (batch,), generator=g)]
    kernel.generate(prompts, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    assert_close(kernel.last_logits(batch), reference_logits(model, kernel, prompts), torch.bfloat16)
    out = kernel.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    fed = [p + c.tokens[:-1] for p, c in zip(prompts, out)]
    assert_close(kernel.last_logits(batch), reference_logits(model, kernel, fed), torch.bfloat16)
