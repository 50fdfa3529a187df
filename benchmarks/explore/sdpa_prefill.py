"""What the torch prefill's attention costs a layer (probe): the baseline's own call
(`baselines.TorchModel.attention`: `F.scaled_dot_product_attention`, causal, GQA, a cache as long as the prompt),
timed by CUDA events, with the backend torch picks for it, next to its causal TFLOP/s. The megakernel's prefill
attention a layer is `profile_step --prefill`'s attention row.

    python -m benchmarks.explore.sdpa_prefill --prompts 512,2048
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.baselines import median_ms
from models.registry import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--prompts", default="512,2048")
    args = parser.parse_args()
    cfg = resolve_model(args.preset).config
    device = torch.device("cuda")
    for n in (int(v) for v in args.prompts.split(",")):
        q = torch.randn(1, cfg.num_attention_heads, n, cfg.head_dim, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(1, cfg.num_key_value_heads, n, cfg.head_dim, device=device, dtype=torch.bfloat16)
                for _ in range(2))
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), device,
                       num_warmup=10, num_reps=100)
        flops = 2 * 2 * cfg.num_attention_heads * cfg.head_dim * n * (n + 1) / 2  # QK and PV, causal
        print(f"{args.preset} prompt {n}: SDPA {ms * 1e3:.1f} us a layer, {flops / ms / 1e9:.0f} TFLOP/s causal")


if __name__ == "__main__":
    main()
