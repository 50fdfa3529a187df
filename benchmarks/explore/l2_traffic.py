"""How many bytes a decode step pulls from L2 into the SMs for each byte it reads from DRAM: baseline (b)'s
kernels (torch + cuBLAS + SDPA, eager, the same kernels its CUDA graph replays) under Nsight Compute, one step,
every kernel's counters summed. The megakernel's own figures come from ncu around its launch
(`benchmarks/RESULTS.md`, session 22). GPU only. Two steps, so that ncu wraps the measured step alone:

    ncu --metrics dram__bytes_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,gpu__time_duration.sum \\
        --profile-from-start off --csv --page raw --log-file /tmp/b64.csv \\
        python -m benchmarks.explore.l2_traffic step --batch 64 --context 512
    python -m benchmarks.explore.l2_traffic summarize /tmp/b64.csv

`ceiling` measures how fast the SMs can read from L2 at all: every program reads a buffer that L2 holds, over
and over (loads cached in L2 only), after the DRAM read bandwidth of the same run.
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict

import torch
import triton
import triton.language as tl

from benchmarks.baselines import make_decode_step, median_ms, read_bandwidth_tbs
from models.registry import resolve_model

METRICS = ("dram__bytes_read.sum", "l1tex__m_xbar2l1tex_read_bytes.sum", "gpu__time_duration.sum")
SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
         "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1, "s": 1}


def step(preset: str, batch: int, context: int) -> None:
    """Warms up, then runs one eager decode step between the profiler's start and stop."""
    cfg = resolve_model(preset).config
    with torch.inference_mode():
        run = make_decode_step(cfg, batch, context, "cuda")
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


@triton.jit
def read_l2(src, out, n_blocks, reps, BLOCK: tl.constexpr):
    """Program p reads blocks p, p + grid, ... of the n_blocks x reps it takes to cover the buffer reps times."""
    pid, grid = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in range(pid, n_blocks * reps, grid):
        acc += tl.load(src + (i % n_blocks) * BLOCK + tl.arange(0, BLOCK), cache_modifier=".cg").to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


def ceiling_tbs(megabytes: int, grid: int, reps: int, block_kb: int) -> float:
    """L2 -> SM read bandwidth: a [n] bf16 buffer of `megabytes` MB, which L2 keeps, read `reps` times over by
    `grid` programs, each taking every grid-th block of `block_kb` KB, a load an iteration
    (Triton may pipeline the loop at its default stages)."""
    device = torch.device("cuda")
    block = block_kb * 512  # bf16 elements
    buffer = torch.randn(megabytes * (1 << 20) // 2, device=device, dtype=torch.bfloat16)
    n_blocks = buffer.numel() // block
    out = torch.empty(grid, device=device)
    ms = median_ms(lambda: read_l2[(grid,)](buffer, out, n_blocks, reps, BLOCK=block, num_warps=4), device,
                   num_warmup=3, num_reps=10)
    return n_blocks * reps * block * 2 / ms / 1e9


def summarize(path: str) -> None:
    """Sums each metric over the kernels of ncu's raw CSV page, and groups the kernels by name."""
    with open(path) as f:
        lines = [line for line in f if not line.startswith("==")]
    rows = list(csv.reader(lines))
    header, units, data = rows[0], rows[1], rows[2:]
    name = header.index("Kernel Name")
    columns = {m: header.index(m) for m in METRICS}
    totals, by_kernel = defaultdict(float), defaultdict(lambda: defaultdict(float))
    for row in data:
        for metric, col in columns.items():
            value = float(row[col].replace(",", "")) * SCALE.get(units[col], 1)
            totals[metric] += value
            by_kernel[row[name][:60]][metric] += value
    dram, l2, seconds = (totals[m] for m in METRICS)
    print(f"{len(data)} kernels, {seconds * 1e3:.2f} ms of kernel time: DRAM read {dram / 1e9:.2f} GB "
          f"({dram / seconds / 1e12:.2f} TB/s), L2 -> SM {l2 / 1e9:.2f} GB ({l2 / seconds / 1e12:.2f} TB/s), "
          f"{l2 / dram:.2f} bytes from L2 a DRAM byte")
    print("kernel | time ms | DRAM GB | L2 -> SM GB | ratio")
    for kernel, m in sorted(by_kernel.items(), key=lambda item: -item[1][METRICS[2]])[:12]:
        print(f"{kernel} | {m[METRICS[2]] * 1e3:.3f} | {m[METRICS[0]] / 1e9:.3f} | {m[METRICS[1]] / 1e9:.3f} | "
              f"{m[METRICS[1]] / max(m[METRICS[0]], 1):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("step", help="one eager decode step of baseline (b), for ncu to wrap")
    run.add_argument("--preset", default="llama3-8b")
    run.add_argument("--batch", type=int, default=64)
    run.add_argument("--context", type=int, default=512)
    total = sub.add_parser("summarize", help="sum ncu's raw CSV over the step's kernels")
    total.add_argument("csv")
    top = sub.add_parser("ceiling", help="the L2 -> SM read bandwidth, next to DRAM's")
    top.add_argument("--megabytes", default="8,24", help="buffer sizes, comma-separated (L2 holds 50 MB)")
    top.add_argument("--programs-per-sm", default="2,4,8")
    top.add_argument("--reps", type=int, default=200)
    top.add_argument("--block-kb", default="8", help="KB each load of a program reads, comma-separated")
    args = parser.parse_args()
    if args.command == "step":
        step(args.preset, args.batch, args.context)
    elif args.command == "summarize":
        summarize(args.csv)
    else:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        print(f"DRAM read: {read_bandwidth_tbs('cuda'):.2f} TB/s")
        for megabytes in map(int, args.megabytes.split(",")):
            for per_sm in map(int, args.programs_per_sm.split(",")):
                for block_kb in map(int, args.block_kb.split(",")):
                    tbs = ceiling_tbs(megabytes, sms * per_sm, args.reps, block_kb)
                    print(f"L2 -> SM: {tbs:.2f} TB/s ({megabytes} MB buffer read {args.reps} times, "
                          f"{sms * per_sm} programs, {block_kb} KB loads)")


if __name__ == "__main__":
    main()
