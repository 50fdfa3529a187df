"""Decode and time-to-first-token benchmark on one GPU, in one run, against baselines measured in it:

  (a) roofline: bytes one decode step must read / read bandwidth measured now
  (b) a torch + cuBLAS + SDPA decode step captured in one CUDA graph (benchmarks/baselines.py)
  (c) the same task bodies launched as separate kernels (one per task group) from one CUDA graph
  TTFT: the megakernel's launch with one output token vs a torch prefill (cuBLAS + SDPA) of the prompt.
Prints one table; `--json FILE` also writes the rows.
"""
from __future__ import annotations

import argparse
import gc
import json
import time

import torch

from benchmarks import baselines
from benchmarks.megakernel_tpot import artifact_path, decode_tokens, prefill_budget, tpot_ms
from blinkc.compile_model import WeightsSource, compile_model
from codegen.config import CompileConfig
from models.registry import resolve_model
from runtime.host_driven import HostDriven, capture_step
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


def load_kernel(preset: str, batch: int, max_len: int, tokens_per_step: int, out: str,
                overrides: dict | None = None, max_new_tokens: int = 40) -> Megakernel:
    config = CompileConfig(max_batch=batch, max_tokens_per_step=tokens_per_step, max_model_len=max_len,
                           max_new_tokens=max_new_tokens, **(overrides or {}))
    return Megakernel.load(compile_model(resolve_model(preset), config, out, WeightsSource(seed=0)).path,
                           device="cuda", timeout_s=300)


GRAPH_REPLAYS = 20


def task_kernels_graph_ms(kernel: Megakernel, batch: int, context: int, num_replays: int = GRAPH_REPLAYS) -> float:
    """Baseline (c): one decode step of the same task bodies, one kernel per task group, replayed from
    one CUDA graph (median ms per replay)."""
    driver = HostDriven(kernel)
    prompts = [torch.randint(0, 1000, (context,)).tolist() for _ in range(batch)]
    kernel.prepare(prompts, SamplingParams(max_tokens=num_replays + 8, temperature=0, ignore_eos=True))
    prefill_steps = -(-batch * context // kernel.config.max_tokens_per_step)
    for step in range(prefill_steps + 1):
        driver.step(step)
    graph = capture_step(driver, prefill_steps + 1)
    times = []
    for _ in range(num_replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def ttft_ms(kernel: Megakernel, prompt_len: int) -> float:
    prompt = [torch.randint(0, 1000, (prompt_len,)).tolist()]
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    kernel.generate(prompt, once)
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        kernel.generate(prompt, once)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def free(*objects) -> None:
    del objects
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--decode", default="1x512,8x512,64x512", help="batch x context pairs")
    parser.add_argument("--ttft", default="128,512", help="prompt lengths")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="a CompileConfig field for every kernel of the run (e.g. wide_n=128), repeatable")
    args = parser.parse_args()
    overrides = {key: int(value) for key, value in (item.split("=", 1) for item in args.set)}
    cfg = resolve_model(args.preset).config
    device = torch.device("cuda")
    bandwidth = baselines.read_bandwidth_tbs(device)
    rows = []

    def add(*row: str) -> None:
        rows.append(row)
        print(" | ".join(row), flush=True)

    add("device", torch.cuda.get_device_name(), "", "")
    add("read bandwidth TB/s", f"{bandwidth:.2f}", "", "")
    if overrides:
        add("config overrides", " ".join(args.set), "", "")
    for pair in filter(None, args.decode.split(",")):
        batch, context = (int(v) for v in pair.split("x"))
        per_step = prefill_budget(batch, context)
        new_tokens = decode_tokens(batch, context, per_step, 16)
        max_len = context + max(new_tokens, GRAPH_REPLAYS + 8) + 8  # (c) decodes GRAPH_REPLAYS + 8 tokens too
        kernel = load_kernel(args.preset, batch, max_len, per_step, artifact_path("decode"),
                             overrides, max_new_tokens=max(new_tokens, 40))
        ours = tpot_ms(kernel, batch, context, 16)
        task_kernels = task_kernels_graph_ms(kernel, batch, context)
        free(kernel)
        torch_ms = baselines.torch_decode_ms(cfg, batch, context, device)
        roofline = baselines.decode_bytes_per_step(cfg, batch, context) / (bandwidth * 1e12) * 1e3
        add(f"decode b{batch} ctx{context} ms", f"{ours:.2f}", f"torch graph {torch_ms:.2f}",
            f"task kernels graph {task_kernels:.2f}",
            f"roofline {roofline:.2f} ({roofline / ours:.0%} of BW; {torch_ms / ours:.2f}x torch)")
        free()
    for prompt_len in (int(v) for v in filter(None, args.ttft.split(","))):
        kernel = load_kernel(args.preset, 1, prompt_len + 8, prompt_len, artifact_path("ttft"), overrides)
        ours = ttft_ms(kernel, prompt_len)
        free(kernel)
        torch_ms = baselines.torch_prefill_ms(cfg, prompt_len, device)
        add(f"TTFT {prompt_len} tokens ms", f"{ours:.2f}", f"torch prefill {torch_ms:.2f}",
            f"{torch_ms / ours:.2f}x torch")
        free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
