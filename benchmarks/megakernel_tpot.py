"""Time per output token of the megakernel: the median length of the steps in which every sequence of the
batch decodes (one token each, no prefill chunk), from the step log the kernel keeps (the global timer at
each step's planning). Prints the roofline share against the read bandwidth measured in the same run."""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.baselines import read_bandwidth_tbs
from blinkc.compile_model import WeightsSource, build_graph, compile_model
from codegen.config import CompileConfig
from ir.analysis import decode_bytes
from models.registry import resolve_model
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


def artifact_path(name: str) -> Path:
    """A fresh place for a benchmark's compiled artifact."""
    return Path(tempfile.mkdtemp(prefix="blink-bench-")) / f"{name}.cubin"


def prefill_budget(batch: int, context: int) -> int:
    """The prefill budget the decode benchmarks compile with: decode steps do not depend on it, the
    benchmark's prefill of every prompt does (larger chunks, fewer steps; activations grow with it)."""
    return max(256, min(2048, batch * context))


def decode_tokens(batch: int, context: int, tokens_per_step: int, num_tokens: int) -> int:
    """Tokens to generate so that at least `num_tokens` steps decode the whole batch: sequences that finish
    their prefill early decode alongside the others' prefill chunks, and finish early too."""
    return num_tokens + -(-batch * context // tokens_per_step) + 1


def decode_config(batch: int, context: int, num_tokens: int, **fields) -> CompileConfig:
    """The kernel a decode benchmark compiles: prompts of `context` tokens, and room for at least `num_tokens`
    steps that decode the whole batch."""
    per_step = prefill_budget(batch, context)
    new_tokens = decode_tokens(batch, context, per_step, num_tokens)
    return CompileConfig(max_batch=batch, max_tokens_per_step=per_step, max_model_len=context + new_tokens + 8,
                         max_new_tokens=new_tokens, **fields)


def tpot_ms(kernel: Megakernel, batch: int, context: int, num_tokens: int) -> float:
    prompts = [torch.randint(0, 1000, (context,)).tolist() for _ in range(batch)]
    params = SamplingParams(max_tokens=decode_tokens(batch, context, kernel.config.max_tokens_per_step, num_tokens),
                            temperature=0, ignore_eos=True)
    kernel.generate(prompts, params)  # warm up
    kernel.generate(prompts, params)
    return full_batch_step_ms(kernel.step_log(), batch)


def full_batch_step_ms(steps: list[tuple[int, int, int]], batch: int) -> float:
    """Median length in ms of the logged steps (timer ns, tokens, sequences) that decode all `batch`
    sequences and nothing else; a step lasts until the next one is planned."""
    full = sorted(end - start for (start, tokens, seqs), (end, _, _) in zip(steps, steps[1:])
                  if tokens == seqs == batch)
    if not full:
        raise RuntimeError(f"no step decoded all {batch} sequences (tokens, sequences: {[s[1:] for s in steps]})")
    return full[len(full) // 2] / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--tiles", default="16x512", help="comma-separated block_n x block_k pairs to compare")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="another CompileConfig field (e.g. qkv_block_m=16), repeatable")
    args = parser.parse_args()
    for tile in args.tiles.split(","):
        block_n, block_k = (int(v) for v in tile.split("x"))
        run(args, block_n, block_k)


def run(args, block_n: int, block_k: int) -> None:
    model = resolve_model(args.preset)
    config = decode_config(args.batch, args.context, args.tokens, block_n=block_n, block_k=block_k,
                           num_stages=args.stages,
                           **{key: int(value) for key, value in (item.split("=", 1) for item in args.set)})
    t0 = time.perf_counter()
    path = compile_model(model, config, artifact_path("bench"), WeightsSource(seed=0)).path
    kernel = Megakernel.load(path, device="cuda", timeout_s=120)
    print(f"compile+load {time.perf_counter() - t0:.1f} s, grid {kernel.kernel.grid}, regs {kernel.kernel.n_regs}, "
          f"spills {kernel.kernel.n_spills}")
    bw = read_bandwidth_tbs("cuda")
    ms = tpot_ms(kernel, args.batch, args.context, args.tokens)
    read = decode_bytes(build_graph(model, config), args.batch, args.context).total
    roofline = read / (bw * 1e12) * 1e3
    print(f"{args.preset} batch {args.batch} ctx {args.context} tiles {block_n}x{block_k} stages {args.stages} "
          f"{' '.join(args.set)}: TPOT {ms:.2f} ms | roofline {roofline:.2f} ms at "
          f"{bw:.2f} TB/s measured | {roofline / ms:.0%} of read bandwidth | {args.batch * 1e3 / ms:.0f} tok/s")


if __name__ == "__main__":
    main()
