"""Does one kernel give the same output launch after launch? (probe) Prefills one seeded prompt RUNS times in a
kernel compiled for it (as `megakernel_tpot`'s TTFT rows), and compares each launch's fp32 logits and greedy
tokens with the first launch's.

    python -m benchmarks.explore.repeat --preset qwen3-30b-a3b --prompt-len 2048 --runs 20
    TRITON_INTERPRET=1 python -m benchmarks.explore.repeat --preset tiny-qwen3-moe --prompt-len 40 --runs 3   # CPU

Session 41 saw one launch of a 2,048-token Qwen3-30B-A3B kernel sample another first token than four others
(benchmarks/explore/NOTES.md). Logits that differ by a few ulps point at fp32 sums whose order varies (the norms'
sums of squares are `atomic_add`s of every column tile's partial); larger differences, or tokens that differ with
identical logits, at a race."""
from __future__ import annotations

import argparse

import torch

from benchmarks.megakernel_tpot import artifact_path, parse_field, seeded_prompt, ttft_config
from blinkc.compile_model import WeightsSource, compile_model
from models.registry import resolve_model
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens a launch")
    parser.add_argument("--set", action="append", default=[], help="CompileConfig field=value")
    args = parser.parse_args()
    fields = {k: parse_field(v) for k, v in (s.split("=", 1) for s in args.set)}
    gpu = torch.cuda.is_available()
    config = ttft_config(args.prompt_len, interpret=not gpu, **fields)
    path = compile_model(resolve_model(args.preset), config, artifact_path("repeat"), WeightsSource(seed=0)).path
    kernel = Megakernel.load(path, device="cuda" if gpu else "cpu", timeout_s=120)
    vocab = kernel.manifest["model"]["vocab_size"]
    prompt = seeded_prompt(args.prompt_len)
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    base_logits = base_tokens = None
    differing = 0
    for run in range(args.runs):
        kernel.generate([prompt], first)  # the prefill's logits stay in the arena after a one-token launch
        logits = kernel.last_logits()[0].double().cpu()
        tokens = kernel.generate([prompt], greedy)[0].tokens
        if base_logits is None:
            base_logits, base_tokens = logits, tokens
            print(f"{args.preset} prompt {args.prompt_len}: run 0 tokens {tokens}", flush=True)
            continue
        diff = (logits - base_logits).abs()
        top2 = base_logits.topk(2).values
        same = bool(diff.max() == 0) and tokens == base_tokens
        differing += not same
        print(f"run {run}: logits max |diff| {diff.max():.3g} ({int((diff > 0).sum())} of {vocab} differ; run 0's "
              f"top two {float(top2[0] - top2[1]):.3g} apart), tokens "
              f"{'the same' if tokens == base_tokens else tokens}", flush=True)
    print(f"{differing} of {args.runs - 1} runs differ from run 0", flush=True)


if __name__ == "__main__":
    main()
