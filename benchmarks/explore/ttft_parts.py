"""Where a time to first token goes, host to host (probe): the benchmark's TTFT (`megakernel_tpot.ttft_ms`) is
`Megakernel.generate` timed on the host, as the torch prefill's (`baselines.torch_ttft_ms`: the ids copied in, the
graph replayed, the token read back) is; torch's host work is 0.04-0.17 ms on the H200 machine. This splits one
`generate` into the host's request writes (`prepare`), the kernel as CUDA events see it, the prefill step as the
kernel's own step log sees it, and what the host spends after the kernel ends (the hang check and the tokens, read
from the state copied back behind the kernel). The launch is the runtime's; its end is awaited the runtime's way
(`wait_for`), asleep in the driver on a blocking event, by polling the event every 0.5 ms, every 0.1 ms or without
a pause ("spin"), or giving up the core between polls ("yield"): "launch to noticed" less "kernel (events)" is how
late the host sees the end. `--profile-prepare` adds a cProfile of the request writes.

    python -m benchmarks.explore.ttft_parts --prompts 512,2048
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

import torch

from benchmarks.megakernel_tpot import artifact_path, ttft_config, ttft_ms
from blinkc.compile_model import WeightsSource, compile_model
from models.registry import resolve_model
from runtime.megakernel import Megakernel, use_scratch_allocator, wait_for
from runtime.sampling import SamplingParams


def launch(kernel: Megakernel, max_steps: int, end: torch.cuda.Event, wait: str) -> None:
    """The launch as the runtime makes it, `end` recorded right behind the kernel, then its end awaited as `wait`
    says: "runtime" (`wait_for`), "blocking" (asleep in the driver until the event), "spin" (`query` without a
    pause), or a polling period in ms ("0.5": `query` every 0.5 ms, the runtime's way before)."""
    use_scratch_allocator()
    stream = torch.cuda.current_stream()
    kernel.kernel(*kernel._args(max_steps), stream=stream.cuda_stream)  # noqa: SLF001 (generate's own pieces)
    kernel._i32_back.copy_(kernel.i32, non_blocking=True)  # noqa: SLF001 (the state's copy, as `_launch` queues it)
    end.record()
    if wait == "runtime":
        assert wait_for(end, 120.0)
        return
    if wait == "blocking":  # made with blocking=True: the thread sleeps in the driver until the event
        end.synchronize()
        return
    if wait == "yield":  # query, giving the core to any other runnable thread between queries
        while not end.query():
            os.sched_yield()
        return
    pause = 0.0 if wait == "spin" else float(wait) * 1e-3
    while not end.query():
        if pause:
            time.sleep(pause)


def profile_prepare(kernel: Megakernel, prompt_len: int, reps: int) -> None:
    """cProfile of `reps` prepares of one prompt (each followed by a sync), the functions taking the most time."""
    prompt = [torch.randint(0, 1000, (prompt_len,)).tolist()]
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    profiler = cProfile.Profile()
    for _ in range(reps):
        torch.cuda.synchronize()
        profiler.enable()
        kernel.prepare(prompt, once)
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def parts(kernel: Megakernel, prompt_len: int, reps: int, wait: str) -> dict[str, float]:
    prompt = [torch.randint(0, 1000, (prompt_len,)).tolist()]
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    kernel.generate(prompt, once)
    rows: dict[str, list[float]] = {}
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        max_steps = kernel.prepare(prompt, once)
        t1 = time.perf_counter()
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True, blocking=wait == "blocking")
        begin.record()
        launch(kernel, max_steps, end, wait)
        t2 = time.perf_counter()
        state = kernel._i32_back  # noqa: SLF001 (copied behind the kernel)
        kernel._raise_on_hang(state)  # noqa: SLF001
        kernel.completions(1, state)
        t3 = time.perf_counter()
        end.synchronize()
        steps = kernel.step_log()
        for name, ms in (("prepare", (t1 - t0) * 1e3), ("launch to noticed", (t2 - t1) * 1e3),
                         ("kernel (events)", begin.elapsed_time(end)),
                         ("step 0 (step log)", (steps[1][0] - steps[0][0]) / 1e6 if len(steps) > 1 else float("nan")),
                         ("after the kernel", (t3 - t2) * 1e3), ("generate", (t3 - t0) * 1e3)):
            rows.setdefault(name, []).append(ms)
    return {name: statistics.median(v) for name, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--prompts", default="512,2048")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--waits", default="runtime blocking spin 0.5",
                        help="ways to await the kernel's end (also: yield, a period in ms)")
    parser.add_argument("--profile-prepare", action="store_true", help="cProfile the request writes too")
    args = parser.parse_args()
    model = resolve_model(args.preset)
    for prompt_len in map(int, args.prompts.split(",")):
        path = compile_model(model, ttft_config(prompt_len), artifact_path("ttft"), WeightsSource(seed=0)).path
        kernel = Megakernel.load(path, device="cuda", timeout_s=120)
        print(f"{args.preset} TTFT {prompt_len}: benchmark (best of 3) {ttft_ms(kernel, prompt_len)[0]:.2f} ms",
              flush=True)
        if args.profile_prepare:
            profile_prepare(kernel, prompt_len, 50)
        for wait in args.waits.split() * 2:
            medians = parts(kernel, prompt_len, args.reps, wait)
            print(f"  end awaited {wait:>8s}, medians of {args.reps}: "
                  + ", ".join(f"{name} {ms:.3f}" for name, ms in medians.items()), flush=True)
        del kernel
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
