"""Time per output token of the megakernel: (launch with n+1 tokens - launch with 1 token) / n, so the
prefill and the launch are subtracted out. Prints the roofline share against the read bandwidth measured
in the same run."""
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


def tpot_ms(kernel: Megakernel, batch: int, context: int, num_tokens: int) -> float:
    prompts = [torch.randint(0, 1000, (context,)).tolist() for _ in range(batch)]
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    many = SamplingParams(max_tokens=num_tokens + 1, temperature=0, ignore_eos=True)
    kernel.generate(prompts, one)  # warm up
    times = {}
    repeats = 1 if batch * context > 8192 else 2  # each launch prefills the whole batch again
    for name, params in (("one", one), ("many", many)) * repeats:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kernel.generate(prompts, params)
        torch.cuda.synchronize()
        times.setdefault(name, []).append(time.perf_counter() - t0)
    return (min(times["many"]) - min(times["one"])) / num_tokens * 1e3


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
    config = CompileConfig(max_batch=args.batch, max_tokens_per_step=max(256, args.batch),
                           max_model_len=args.context + args.tokens + 8, max_new_tokens=args.tokens + 2,
                           block_n=block_n, block_k=block_k, num_stages=args.stages,
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
