"""The batched decode block alone: [rows, BN] products of a projection over split K ranges, as the megakernel's
`split_block` computes them at batch 64 (x [64, K] bf16 times W [N, K] bf16, each block's fp32 partials stored,
not summed), in a standalone Triton kernel whose shape can change in seconds. Prints each variant's time and
its weight stream in TB/s next to cuBLAS's `x @ W.T` and the DRAM read bandwidth measured in the same run.
A probe for the megakernel's batched path, not part of it:

    python -m benchmarks.explore.batched_block                     # Llama-3-8B's gate/up, the default variants
    python -m benchmarks.explore.batched_block --shape 4096x14336  # down
    python -m benchmarks.explore.batched_block --variants "bn=64,splits=4 bn=128,splits=4,warps=8"

A variant is comma-separated fields of `Variant` (bn, bk, splits, stages, warps, programs (0: one per task),
tma (0/1)).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs


@triton.jit
def split_blocks(X, W, PARTS, M, N, K, splits, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 STAGES: tl.constexpr, TMA: tl.constexpr):
    """Task t (block t // splits, split t % splits; programs take every grid-th task) stores the fp32 product
    of all M rows and the block's BN weight rows over its split's K range to PARTS[split, :, block columns]."""
    num_blocks = tl.cdiv(N, BN)
    chunk = tl.cdiv(tl.cdiv(K, splits), BK) * BK
    rows = tl.arange(0, BM)
    for t in range(tl.program_id(0), num_blocks * splits, tl.num_programs(0)):
        block, split = t // splits, t % splits
        n0, k_lo = block * BN, split * chunk
        k_hi = tl.minimum(K, k_lo + chunk)
        cols = n0 + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), tl.float32)
        if TMA:
            xd = tl.make_tensor_descriptor(X, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
            wd = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
            for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
                acc = tl.dot(xd.load([0, k0]), tl.trans(wd.load([n0, k0])), acc)
        else:
            for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
                ks = k0 + tl.arange(0, BK)
                k_ok = (ks < k_hi)[None, :]
                x = tl.load(X + rows[:, None] * K + ks[None, :], mask=(rows < M)[:, None] & k_ok, other=0.0)
                w = tl.load(W + cols[:, None].to(tl.int64) * K + ks[None, :], mask=(cols < N)[:, None] & k_ok,
                            other=0.0)
                acc = tl.dot(x, tl.trans(w), acc)
        tl.store(PARTS + split * M * N + rows[:, None] * N + cols[None, :], acc,
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

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        types = {f.name: f.type for f in fields(cls)}
        items = [item.split("=", 1) for item in filter(None, spec.split(","))]
        unknown = [key for key, _ in items if key not in types]
        if unknown:
            raise SystemExit(f"unknown variant fields {unknown}; known: {sorted(types)}")
        return replace(cls(), **{key: int(value) for key, value in items})

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) !=
                        f.default) or "default"


DEFAULT_VARIANTS = ("programs=0 warps=8 bn=128,splits=4 bn=128,splits=4,warps=8 bn=128,splits=2 "
                    "bn=256,splits=4,warps=8 bn=128,splits=4,stages=3,bk=128 tma=1 bn=128,splits=4,tma=1 "
                    "stages=6 bn=64,splits=8")


def run_variant(v: Variant, x: torch.Tensor, w: torch.Tensor, expected: torch.Tensor) -> float:
    m, k = x.shape
    n = w.shape[0]
    parts = torch.empty(v.splits, m, n, device=x.device, dtype=torch.float32)
    tasks = triton.cdiv(n, v.bn) * v.splits
    grid = (v.programs or tasks,)
    launch = lambda: split_blocks[grid](x, w, parts, m, n, k, v.splits, BM=64, BN=v.bn, BK=v.bk,  # noqa: E731
                                        STAGES=v.stages, TMA=bool(v.tma), num_warps=v.warps)
    launch()
    error = (parts.sum(0) - expected).abs().max().item() / expected.abs().max().item()
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
