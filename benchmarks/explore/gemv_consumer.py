"""How fast can one program of the batch-1 GEMV consume weights, from DRAM and from L2? (probe, not the kernel)

In the megakernel a batch-1 projection task streams ~128 KB of weights at 13-16 GB/s a program, about a 264th of
the DRAM bandwidth, and no faster when those weights already sit in L2 (o_proj's tasks, prefetched during
attention, took as long as gate/up's from DRAM). If the body's own arithmetic bounds it, then no prefetch, ring or
overlap can hide a boundary's wait: the program cannot catch up. This probe times the body alone, persistent on
`--programs` programs, over a matrix that fits in L2 and over one that does not, and prints each variant's rate a
program next to the DRAM bandwidth measured in the same run:

- `fma`: the megakernel's `gemv_row` loop ([BN, BK] weights times the input in fp32 FMAs, one reduction a unit);
- `dot`: the same chunk through the tensor cores, `tl.dot(w [BN, BK], x [BK, 16])` with the input in column 0
  and zeros beside it (the products are exact in fp32 either way; only the order of the sums differs).

    python -m benchmarks.explore.gemv_consumer                       # on an H100 / H200
    python -m benchmarks.explore.gemv_consumer --variants "fma,bn=16,bk=512 dot,bn=64,bk=128"

A variant is comma-separated: the body (fma or dot), then fields bn, bk, stages, programs.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs
from benchmarks.explore.variant_fields import with_kind

UNIT_BYTES = 128 * 1024  # weights a unit (a task in the megakernel): BN rows x UNIT_BYTES / (2 BN) columns


@triton.jit
def gemv_units(W, X, OUT, N, K, repeat, KU: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               STAGES: tl.constexpr, DOT: tl.constexpr):
    """Unit u (rows (u // splits) * BN .., columns (u % splits) * KU ..) of W [N, K] times X [K]; the units of
    `repeat` passes over W, a program taking every grid-th one. Stores each unit's fp32 [BN] partial at
    OUT[split, rows]."""
    splits = K // KU
    units = (N // BN) * splits
    lanes = tl.arange(0, BN)
    ACC2D: tl.constexpr = BN * BK <= 8192  # the FMA body's [BN, BK] accumulator, as in `gemv_row`
    for t in range(tl.program_id(0), units * repeat, tl.num_programs(0)):
        u = t % units
        block, split = u // splits, u % splits
        w_rows = W + (block * BN + lanes)[:, None].to(tl.int64) * K + split * KU
        x_base = X + split * KU
        if DOT:
            acc = tl.zeros((BN, 16), tl.float32)
        elif ACC2D:
            acc = tl.zeros((BN, BK), tl.float32)
        else:
            acc = tl.zeros((BN, ), tl.float32)
        for k0 in tl.range(0, KU, BK, num_stages=STAGES):
            ks = k0 + tl.arange(0, BK)
            w = tl.load(w_rows + ks[None, :])
            x = tl.load(x_base + ks)
            if DOT:
                xb = tl.where(tl.arange(0, 16)[None, :] == 0, x[:, None], tl.zeros((BK, 16), x.dtype))
                acc = tl.dot(w, xb, acc)
            elif ACC2D:
                acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
            else:
                acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        if DOT or ACC2D:
            y = tl.sum(acc, 1)
        else:
            y = acc
        tl.store(OUT + split * N + block * BN + lanes, y)


@dataclass(frozen=True)
class Variant:
    body: str = "fma"
    bn: int = 16
    bk: int = 512
    stages: int = 3
    programs: int = 264

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        return with_kind(cls, spec, ("fma", "dot"))

    @property
    def ku(self) -> int:
        return UNIT_BYTES // (2 * self.bn)


def run(variant: Variant, w: torch.Tensor, x: torch.Tensor, repeat: int, bw: float, label: str) -> None:
    n, k = w.shape
    out = torch.empty(k // variant.ku, n, dtype=torch.float32, device=w.device)

    def launch():
        gemv_units[(variant.programs,)](w, x, out, n, k, repeat, KU=variant.ku, BN=variant.bn, BK=variant.bk,
                                        STAGES=variant.stages, DOT=variant.body == "dot", num_warps=4)
    launch()
    torch.cuda.synchronize()
    ref = (w.float() @ x.float())
    err = ((out.sum(0) - ref).norm() / ref.norm()).item()
    ms = median_ms(launch, w.device, num_warmup=2, num_reps=20)
    nbytes = w.numel() * 2 * repeat
    per_program = nbytes / (ms * 1e-3) / variant.programs / 1e9
    print(f"{label:5s} {variant.body} bn={variant.bn:3d} bk={variant.bk:4d} stages={variant.stages} "
          f"programs={variant.programs}: {ms:8.3f} ms  {nbytes / ms / 1e9:6.2f} TB/s  "
          f"{per_program:5.1f} GB/s a program  ({100 * nbytes / ms / 1e9 / bw:5.1f}% of DRAM)  rel err {err:.1e}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="fma,bn=16,bk=512 fma,bn=16,bk=256,stages=5 dot,bn=16,bk=512 "
                        "dot,bn=16,bk=256,stages=4 dot,bn=64,bk=128 dot,bn=64,bk=128,stages=4 dot,bn=64,bk=256 "
                        "dot,bn=128,bk=64,stages=4")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = read_bandwidth_tbs("cuda")
    print(f"{torch.cuda.get_device_name()}: DRAM read {bw:.2f} TB/s", flush=True)
    k = 4096
    small = torch.randn(2048, k, device="cuda").to(torch.bfloat16)  # 16 MB: stays in L2 between passes
    large = torch.randn(28672, k, device="cuda").to(torch.bfloat16)  # gate/up, 235 MB
    x = torch.randn(k, device="cuda").to(torch.bfloat16)
    for spec in args.variants.split():
        variant = Variant.parse(spec)
        for programs in (variant.programs, 2 * variant.programs):
            v = replace(variant, programs=programs)
            run(v, small, x, 40, bw, "L2")
            run(v, large, x, 2, bw, "DRAM")


if __name__ == "__main__":
    main()
