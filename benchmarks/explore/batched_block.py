"""The batched decode block alone: [rows, BN] products of a projection over split K ranges, as the megakernel's
`split_block` computes them at batch 64 (x [64, K] bf16 times W [N, K] bf16; the last split of a block sums the
fp32 partials in order, with the megakernel's `sum_of_splits`), in a standalone Triton kernel whose shape can
change in seconds. Prints each variant's time and
its weight stream in TB/s next to cuBLAS's `x @ W.T` and the DRAM read bandwidth measured in the same run.
A probe for the megakernel's batched path, not part of it:

    python -m benchmarks.explore.batched_block                     # Llama-3-8B's gate/up, the default variants
    python -m benchmarks.explore.batched_block --shape 4096x14336  # down
    python -m benchmarks.explore.batched_block --variants "bn=64,splits=4 bn=128,splits=4,warps=8"

A variant is comma-separated fields of `Variant` (bn, bk, splits, stages, warps, programs (0: one per task),
tma (0/1), rotate (0/1), reduce (0/1)); "default" is the megakernel's batched block at 64 columns, 4 splits.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs
from benchmarks.explore.variant_fields import with_fields
from codegen.bodies.common import sum_of_splits
from codegen.bodies.linear import tile_product


@triton.jit
def split_blocks(X, W, PARTS, OUT, M, N, K, splits, part_off, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 STAGES: tl.constexpr, TMA: tl.constexpr, REDUCE: tl.constexpr, ROTATE: tl.constexpr):
    """Task t (block t // splits, split t % splits; programs take every grid-th task) computes the fp32 product
    of all M rows (M = BM) and the block's BN weight rows over its split's K range. Without REDUCE it stores it
    to its split's [M, N] plane of the partials at PARTS + part_off. With REDUCE, as the megakernel does, a
    whole block stores it to OUT; a split stores it to the block's slot at PARTS + part_off, and the split that
    takes the block's ticket (PARTS[block]) last sums the partials in order into OUT and zeroes the ticket for
    the next launch."""
    num_blocks = tl.cdiv(N, BN)
    chunk = tl.cdiv(tl.cdiv(K, splits), BK) * BK
    rows = tl.arange(0, BM)
    for t in range(tl.program_id(0), num_blocks * splits, tl.num_programs(0)):
        block, split = t // splits, t % splits
        n0, k_lo = block * BN, split * chunk
        k_hi = tl.multiple_of(tl.minimum(K, k_lo + chunk), 8)  # as `split_block`: keeps the K mask vector-wide
        cols = n0 + tl.arange(0, BN)
        # the megakernel's K loop itself (`tile_product`); ROTATE: block b starts its K range b chunks in and
        # wraps around (two loops), so that the programs' loads at one moment fall on different offsets within
        # the weight rows (a power-of-two stride)
        rot = (block % tl.cdiv(k_hi - k_lo, BK)) * BK if ROTATE else 0
        acc = tile_product(0, K, K, 0, N, 0, n0, k_lo + rot, k_hi, M, W, X, BM, BN, BK, False, STAGES, TMA)
        if ROTATE:
            acc += tile_product(0, K, K, 0, N, 0, n0, k_lo, k_lo + rot, M, W, X, BM, BN, BK, False, STAGES, TMA)
        if REDUCE:
            if splits == 1:
                tl.store(OUT + rows[:, None] * N + cols[None, :], acc, mask=(cols < N)[None, :])
            else:
                last, total = sum_of_splits(PARTS, part_off, 0, block, split, splits, acc, rows, BM)
                if last:
                    tl.store(PARTS + block, 0.0)
                    tl.store(OUT + rows[:, None] * N + cols[None, :], total, mask=(cols < N)[None, :])
        else:
            tl.store(PARTS + part_off + split * M * N + rows[:, None] * N + cols[None, :], acc,
                     mask=(rows < M)[:, None] & (cols < N)[None, :])


@dataclass(frozen=True)
class Variant:
    bn: int = 64
    bk: int = 64
    splits: int = 4
    stages: int = 4
    warps: int = 4
    programs: int = 264  # 0: one program a task
    tma: int = 0
    rotate: int = 0  # 1: each block starts its K range at a different chunk
    reduce: int = 1  # the last split sums the partials (the megakernel's `sum_of_splits`); 0: stores only

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        return with_fields(cls(), spec.split(","), spec)

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) !=
                        f.default) or "default"


DEFAULT_VARIANTS = ("splits=1 splits=2 reduce=0 bn=128,splits=1 bn=128,splits=2 bn=32,splits=8 programs=0 "
                    "warps=8 stages=6 tma=1 bn=128,splits=4,stages=3,bk=128")


def run_variant(v: Variant, x: torch.Tensor, w: torch.Tensor, expected: torch.Tensor) -> float:
    m, k = x.shape
    n = w.shape[0]
    blocks = triton.cdiv(n, v.bn)
    part_off = -(-blocks // 16) * 16  # the blocks' tickets, then the partials (16-float aligned)
    scratch = torch.zeros(part_off + v.splits * m * n, device=x.device, dtype=torch.float32)
    parts = scratch[part_off:].view(v.splits, m, n)  # (without REDUCE: split-major)
    out = torch.empty(m, n, device=x.device, dtype=torch.float32)
    grid = (v.programs or blocks * v.splits,)
    launch = lambda: split_blocks[grid](  # noqa: E731
        x, w, scratch, out, m, n, k, v.splits, part_off, BM=m, BN=v.bn, BK=v.bk, STAGES=v.stages, TMA=bool(v.tma),
        REDUCE=bool(v.reduce), ROTATE=bool(v.rotate), num_warps=v.warps)
    launch()
    result = out if v.reduce else parts.sum(0)
    error = (result - expected).abs().max().item() / expected.abs().max().item()
    if error > 1e-2:
        raise SystemExit(f"{v}: relative error {error:.2e} against torch")
    return median_ms(launch, x.device, num_warmup=3, num_reps=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="28672x4096", help="N x K of the weight (default: Llama-3-8B gate/up)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--variants", default="default " + DEFAULT_VARIANTS)
    args = parser.parse_args()
    device = torch.device("cuda")
    # descriptors made in a kernel need a scratch allocator
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))
    n, k = map(int, args.shape.split("x"))
    x = torch.randn(args.rows, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k ** 0.5
    weight_bytes = w.numel() * w.element_size()
    dram = read_bandwidth_tbs(device)
    with torch.inference_mode():
        expected = (x @ w.T).float()
        cublas = median_ms(lambda: x @ w.T, device, num_warmup=3, num_reps=30)
    print(f"{torch.cuda.get_device_name()}: [{args.rows}, {k}] x [{n}, {k}].T, {weight_bytes / 1e6:.0f} MB of "
          f"weights; DRAM read {dram:.2f} TB/s")
    print(f"cuBLAS x @ W.T | {cublas * 1e3:.1f} us | {weight_bytes / cublas / 1e9:.2f} TB/s | 1.00x")
    for spec in args.variants.split():
        v = Variant.parse("" if spec == "default" else spec)
        try:
            ms = run_variant(v, x, w, expected)
        except Exception as e:  # a shape that does not compile (shared memory, registers): say so, go on
            print(f"{v} | failed: {str(e).splitlines()[0][:120]}")
            continue
        print(f"{v} | {ms * 1e3:.1f} us | {weight_bytes / ms / 1e9:.2f} TB/s | {cublas / ms:.2f}x")


if __name__ == "__main__":
    main()
