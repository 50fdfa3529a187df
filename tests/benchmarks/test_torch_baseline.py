"""The torch baseline's three ways to run routed experts (benchmarks/baselines.py) agree."""
from __future__ import annotations

import pytest
import torch

from benchmarks import baselines
from models.registry import resolve_model

needs_grouped = pytest.mark.skipif(not baselines.grouped_experts_available("cpu"),
                                   reason="this torch has no grouped GEMM")


@needs_grouped
@pytest.mark.parametrize("num_tokens", [3, 29])  # a decode step's few pairs, a prefill's (some expert has none)
def test_grouped_experts_match_the_gathered_and_looped_ones(num_tokens):
    cfg = resolve_model("tiny-qwen3-moe").config  # 6 experts, top 2
    gen = torch.Generator().manual_seed(num_tokens)
    inter, hidden = cfg.moe_intermediate_size, cfg.hidden_size
    layer = {"gate": torch.randn(cfg.num_experts, hidden, generator=gen).to(torch.bfloat16),
             "experts.gate_up_proj": (0.2 * torch.randn(cfg.num_experts, 2 * inter, hidden, generator=gen)).to(
                 torch.bfloat16),
             "experts.down_proj": (0.2 * torch.randn(cfg.num_experts, hidden, inter, generator=gen)).to(torch.bfloat16)}
    h = torch.randn(num_tokens, hidden, generator=gen).to(torch.bfloat16)
    model = {mode: baselines.TorchModel(cfg, baselines.ModelWeights({"norm": h[0]}, []), experts=mode)
             for mode in baselines.EXPERT_MODES}
    weights, experts = model["grouped"].route(layer, h)
    out = {mode: m.mlp(layer, h) for mode, m in model.items()}
    assert out["grouped"].abs().mean() > 0.5  # the experts' sums are not lost in rounding
    torch.testing.assert_close(out["grouped"], out["looped"], rtol=0.02, atol=0.02)
    torch.testing.assert_close(out["grouped"], out["gathered"], rtol=0.02, atol=0.02)


@needs_grouped
def test_a_moe_prefill_runs_with_grouped_experts():
    cfg = resolve_model("tiny-qwen3-moe").config
    with torch.inference_mode():  # as `torch_prefill_ms` runs it
        logits = baselines.make_prefill_step(cfg, 9, "cpu")()
    assert logits.shape == (1, cfg.vocab_size) and bool(torch.isfinite(logits).all())


def test_an_unknown_experts_mode_is_refused():
    cfg = resolve_model("tiny-qwen3-moe").config
    with pytest.raises(ValueError, match="unknown experts mode 'fused'"):
        baselines.TorchModel(cfg, baselines.random_weights(cfg, "cpu"), experts="fused")


def test_the_prefill_reads_the_ids_it_is_given_each_time_it_runs():
    """`torch_ttft_ms` times the first token host to host by copying the prompt into the pass's ids tensor: the
    step must read that tensor at every run, not a copy taken when it was made."""
    cfg = resolve_model("tiny-llama").config
    ids = torch.zeros(1, 9, dtype=torch.long)
    with torch.inference_mode():
        step = baselines.make_prefill_step(cfg, 9, "cpu", ids=ids)
        first = step().clone()
        ids.copy_(torch.arange(1, 10).view(1, 9))
        assert not torch.equal(step(), first)
        gpu_ms, host_ms = baselines.torch_ttft_ms(cfg, 9, "cpu", num_reps=2)
    assert gpu_ms > 0 and host_ms > 0
