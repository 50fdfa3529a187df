"""Decode and time-to-first-token benchmark on one GPU, in one run, against baselines measured in it:

  (a) roofline: bytes one decode step must read / read bandwidth measured now
  (b) a torch + cuBLAS + SDPA decode step captured in one CUDA graph (benchmarks/baselines.py)
  (c) the same task bodies launched as separate kernels (one per task group) from one CUDA graph
  TTFT: the megakernel's launch with one output token vs a torch prefill (cuBLAS + SDPA) of the prompt, each
  host to host (the prompt's ids from the host, the greedy first token back on it; best of a few), and each
  on the GPU alone (the kernel between CUDA events; the prefill's CUDA graph, median). Up to session 57 the
  table set the megakernel's host-to-host time against the torch graph's GPU time.
An MoE model's torch baselines run the experts as grouped GEMMs (`torch._grouped_mm`, one a matrix over the
pairs sorted by expert) where torch has them; `--torch-experts` picks another way (benchmarks/baselines.py,
EXPERT_MODES). Up to session 39 the MoE figures in benchmarks/RESULTS.md used gathered weights for decode and an
eager loop over the experts for prefill. Prints one table; `--json FILE` also writes the rows.

Each row times a kernel compiled for it (`megakernel_tpot.decode_config`, `ttft_config`): max_batch is the row's
batch, and a decode row's prefill budget min(2,048, batch x context) tokens a step, a TTFT row's the prompt. A
kernel compiled for 512 tokens a step or more takes 128-row prefill tiles, which cost batch-1 decode 2-6% up to
session 36 and ~0.3% since (`megakernel_tpot.prefill_budget`): every decode row's kernel and TTFT 512's and 2048's
have them, TTFT 128's does not. On a Hopper GPU every row's figures are the runtime's on the Gluon kernels
(`Megakernel._gluon`; batch 1 and TTFT since session 66: the prompt through the Gluon bodies, the decode steps in the
one-row loop; a batch since session 73: the prompts on the compiled kernel, the decode steps in the batched loop),
the compiled kernel's alone beside them.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks import baselines
from benchmarks.megakernel_tpot import artifact_path, decode_config, decode_tokens, tpot_ms, ttft_config, ttft_ms
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.config import CompileConfig
from models.registry import resolve_model
from runtime.host_driven import HostDriven, capture_step
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


GRAPH_REPLAYS = 20


def load_kernel(preset: str, config: CompileConfig, out) -> Megakernel:
    return Megakernel.load(compile_model(resolve_model(preset), config, out, WeightsSource(seed=0)).path,
                           device="cuda", timeout_s=300)


def task_kernels_graph_ms(kernel: Megakernel, batch: int, context: int, num_replays: int = GRAPH_REPLAYS) -> float:
    """Baseline (c): one decode step of the same task bodies, one kernel per task group, replayed from
    one CUDA graph (median ms per replay), once every sequence decodes (sequences that finish their prefill
    early decode beside the others' chunks: those steps are larger)."""
    return graph_step_ms(HostDriven(kernel), batch, context, num_replays)


def graph_step_ms(driver: HostDriven, batch: int, context: int, num_replays: int = GRAPH_REPLAYS) -> float:
    """A decode step of `driver`'s launches (every sequence decoding) replayed from one CUDA graph: the median ms per
    replay (each decodes a token more: the plan reads the requests' state on the GPU)."""
    kernel = driver.kernel
    graph = capture_decode_step(driver, batch, context, num_replays + 2)
    times = []
    for _ in range(num_replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    if kernel.last_step_size() != (batch, batch):
        raise RuntimeError(f"a sequence finished before the last of {num_replays} replays")
    return sorted(times)[len(times) // 2]


def capture_decode_step(driver: HostDriven, batch: int, context: int, num_replays: int) -> torch.cuda.CUDAGraph:
    """Prepares `batch` random prompts of `context` tokens with room for `num_replays` more steps, runs the
    task groups step by step until every sequence decodes, and captures the next step in one CUDA graph."""
    kernel = driver.kernel
    prompts = [torch.randint(0, 1000, (context,)).tolist() for _ in range(batch)]
    max_tokens = decode_tokens(batch, context, kernel.config.max_tokens_per_step, num_replays)
    num_steps = kernel.prepare(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return capture_step(driver, steps_until_all_decode(driver, batch, num_steps), size=(batch, batch))


def steps_until_all_decode(driver: HostDriven, batch: int, num_steps: int) -> int:
    """Runs prepared requests step by step until a step decodes all `batch` sequences and nothing else;
    returns the next step's number."""
    for step in range(num_steps):
        driver.step(step)
        if driver.kernel.last_step_size() == (batch, batch):
            return step + 1
    raise RuntimeError(f"no step decoded all {batch} sequences in {num_steps} steps")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--decode", default="1x512,8x512,64x512", help="batch x context pairs")
    parser.add_argument("--ttft", default="128,512", help="prompt lengths")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="a CompileConfig field for every kernel of the run (e.g. wide_n=128), repeatable")
    parser.add_argument("--no-precompile", action="store_true", help="compile each kernel when its row runs")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the run's kernels into the cache and stop (no GPU needed): a GPU run with the "
                             "same BLINK_CACHE_DIR and its cubins then compiles nothing")
    parser.add_argument("--torch-experts", choices=["auto", *baselines.EXPERT_MODES], default="auto",
                        help="how the torch baselines run an MoE model's experts (auto: grouped GEMMs where torch "
                             "has them, else gathered weights for decode and an eager loop for prefill)")
    args = parser.parse_args()
    torch_experts = None if args.torch_experts == "auto" else args.torch_experts
    overrides = {key: int(value) for key, value in (item.split("=", 1) for item in args.set)}
    pairs = [tuple(int(v) for v in pair.split("x")) for pair in filter(None, args.decode.split(","))]
    prompt_lens = [int(v) for v in filter(None, args.ttft.split(","))]
    # room for (c)'s steps, which need more than the megakernel's `tpot_ms`
    decode_configs = {(b, c): decode_config(b, c, GRAPH_REPLAYS + 2, **overrides) for b, c in pairs}
    if args.compile_only or not args.no_precompile:  # the run's kernels side by side, before anything is timed
        configs = list(decode_configs.values()) + [ttft_config(n, **overrides) for n in prompt_lens]
        seconds = compile_many([(args.preset, config) for config in configs],
                               host_driven=list(decode_configs.values()))  # (baseline (c): `HostDriven`)
        print(f"compiled {len(configs)} kernels side by side in {seconds:.0f} s", flush=True)
        if args.compile_only:
            return
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
    if cfg.num_experts:
        for prefill in (False, True):
            mode = torch_experts or baselines.expert_mode(device, prefill=prefill)
            add(f"torch {'prefill' if prefill else 'decode'} experts", baselines.EXPERT_MODES[mode], "", "")
    for batch, context in pairs:
        started = time.perf_counter()
        kernel = load_kernel(args.preset, decode_configs[batch, context], artifact_path("decode"))
        ours = tpot_ms(kernel, batch, context, 16)
        alone = ""
        if (kernel.gluon if batch == 1 else kernel.gluon_batch) is not None:  # (`ours` ran on the Gluon kernels)
            runners, (kernel.gluon, kernel.gluon_batch) = (kernel.gluon, kernel.gluon_batch), (None, None)
            alone = f"; the compiled kernel alone {tpot_ms(kernel, batch, context, 16):.2f}"
            kernel.gluon, kernel.gluon_batch = runners
        task_kernels = task_kernels_graph_ms(kernel, batch, context)
        del kernel  # the baselines below need its memory (a 30B model's weights twice do not fit)
        baselines.release_memory(device)
        torch_ms = baselines.torch_decode_ms(cfg, batch, context, device, experts=torch_experts)
        roofline = baselines.decode_bytes_per_step(cfg, batch, context) / (bandwidth * 1e12) * 1e3
        add(f"decode b{batch} ctx{context} ms", f"{ours:.2f}", f"torch graph {torch_ms:.2f}",
            f"task kernels graph {task_kernels:.2f}",
            f"roofline {roofline:.2f} ({roofline / ours:.0%} of BW; {torch_ms / ours:.2f}x torch{alone})")
        baselines.release_memory(device)
        print(f"  (row took {time.perf_counter() - started:.0f} s)", flush=True)
    for prompt_len in prompt_lens:
        started = time.perf_counter()
        kernel = load_kernel(args.preset, ttft_config(prompt_len, **overrides), artifact_path("ttft"))
        ours, ours_gpu, _ = ttft_ms(kernel, prompt_len)
        alone = ""
        if kernel.gluon is not None:
            kernel.gluon = None
            alone = "; the compiled kernel alone {:.2f} (GPU {:.2f})".format(*ttft_ms(kernel, prompt_len)[:2])
        del kernel
        baselines.release_memory(device)
        torch_gpu, torch_host = baselines.torch_ttft_ms(cfg, prompt_len, device, experts=torch_experts)
        add(f"TTFT {prompt_len} tokens ms", f"{ours:.2f}", f"torch prefill {torch_host:.2f}",
            f"{torch_host / ours:.2f}x torch",
            f"GPU alone {ours_gpu:.2f} against {torch_gpu:.2f} ({torch_gpu / ours_gpu:.2f}x){alone}")
        baselines.release_memory(device)
        print(f"  (row took {time.perf_counter() - started:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
