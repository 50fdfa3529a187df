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

A variant is comma-separated: the body (fma or dot), then fields bn, bk, stages, programs, and the pieces of a
megakernel task around the loop, each 0 or 1: descs (each unit reads its task row, then its descriptor, for its
pointers and K), epilogue (each unit runs the megakernel's own gate/up epilogue: 1/rms, SiLU-gating, a bf16
store), claimed (units past the first wave are claimed from a counter, one at a time, as the megakernel's are),
waits (each pass over the matrix a group that waits for the pass before, as the layer's projections wait for
each other: every program's first unit of a pass waits, and each pass ends in a partial wave), and passes (over
the matrix from DRAM, default 2):

    python -m benchmarks.explore.gemv_consumer --variants "fma fma,descs=1,epilogue=1,claimed=1"
"""
from __future__ import annotations

import argparse
import struct
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms, read_bandwidth_tbs
from benchmarks.explore.variant_fields import with_kind
from codegen.bodies.common import word8
from codegen.bodies.linear import LINEAR_FIELDS, linear_epilogue

UNIT_BYTES = 128 * 1024  # weights a unit (a task in the megakernel): BN rows x UNIT_BYTES / (2 BN) columns


@triton.jit
def gemv_units(W, X, OUT, N, K, repeat, TASKS, DESC, ACT, F32, CLAIM, DONE, KU: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, STAGES: tl.constexpr, DOT: tl.constexpr, DESCS: tl.constexpr,
               EPILOGUE: tl.constexpr, CLAIMED: tl.constexpr, WAITS: tl.constexpr, ROW_WORDS: tl.constexpr,
               DESC_WORDS: tl.constexpr):
    """Unit u (rows (u // splits) * BN .., columns (u % splits) * KU ..) of W [N, K] times X [K]; the units of
    `repeat` passes over W, a program taking every grid-th one, or (CLAIMED) its first that way and the rest from
    the counter CLAIM, one at a time, as the megakernel's claimed tasks. Stores each unit's fp32 [BN] partial at
    OUT[split, rows]. DESCS: each unit first reads its task row and, through it, its descriptor (DESC, the
    megakernel's LINEAR_FIELDS) for the input, weight and shape words, as a task does; EPILOGUE: each unit also
    runs the megakernel's own epilogue (`linear_epilogue`) on its products, as DESC says (gate/up's: 1/rms,
    SiLU-gating, a bf16 store to ACT). WAITS: each pass is a group of its own, as a layer's projections are:
    a unit signals the counter DONE (release) when it is done, and a program's first unit of a pass waits
    (acquire) until every unit of the pass before has signalled."""
    splits = K // KU
    units = (N // BN) * splits
    lanes = tl.arange(0, BN)
    ACC2D: tl.constexpr = BN * BK <= 8192  # the FMA body's [BN, BK] accumulator, as in `gemv_row`
    t = tl.program_id(0)
    waited = 0  # the last pass whose group this program waited for
    while t < units * repeat:
        u = t % units
        if WAITS:
            group = t // units
            if group > waited:
                seen = tl.atomic_add(DONE, 0, sem="acquire")
                spins = 0
                while (seen < group * units) & (spins < 1 << 24):  # a grid not co-resident gives up, not hangs
                    seen = tl.atomic_add(DONE, 0, sem="acquire")
                    spins += 1
                tl.debug_barrier()
                waited = group
        x_base, w_base, k_words = X, W, K
        if DESCS:
            desc = DESC + tl.load(TASKS + t * ROW_WORDS + 1) * DESC_WORDS
            x_base, w_base, k_words = X + word8(desc, 0), W + word8(desc, 3), word8(desc, 2)
        block, split = u // splits, u % splits
        w_rows = w_base + (block * BN + lanes)[:, None].to(tl.int64) * k_words + split * KU
        x_base = x_base + split * KU
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
        if EPILOGUE:
            row = tl.arange(0, 1)
            linear_epilogue(DESC, y[None, :], row, row < 1, block * BN, W, ACT, F32)
        if WAITS:
            tl.debug_barrier()  # every thread's stores before the release
            tl.atomic_add(DONE, 1, sem="release")
        if CLAIMED:
            t = tl.num_programs(0) + tl.atomic_add(CLAIM, 1, sem="relaxed")
        else:
            t += tl.num_programs(0)


@dataclass(frozen=True)
class Variant:
    body: str = "fma"
    bn: int = 16
    bk: int = 512
    stages: int = 3
    programs: int = 264
    descs: int = 0  # 1: each unit reads its task row and descriptor first
    epilogue: int = 0  # 1: each unit runs the megakernel's gate/up epilogue
    claimed: int = 0  # 1: units past the first wave are claimed from a counter
    waits: int = 0  # 1: each pass over the matrix is a group that waits for the one before
    passes: int = 2  # passes over the matrix from DRAM (40 over the one in L2)

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        return with_kind(cls, spec, ("fma", "dot"))

    @property
    def ku(self) -> int:
        return UNIT_BYTES // (2 * self.bn)


def run(variant: Variant, w: torch.Tensor, x: torch.Tensor, repeat: int, bw: float, label: str) -> None:
    n, k = w.shape
    out = torch.empty(k // variant.ku, n, dtype=torch.float32, device=w.device)
    units = n // variant.bn * (k // variant.ku)
    tasks = torch.zeros(units * repeat, 3, dtype=torch.int64, device=w.device)  # (kind, descriptor, tile)
    fields = dict(x_off=0, x_stride=k, k=k, w_off=0, n=n, out_off=0, out_stride=n // 2, out_kind=0, gated=1,
                  stats_off=0, eps=struct.unpack("<q", struct.pack("<d", 1e-5))[0], res_off=-1, res_stride=0,
                  bias_off=-1, out_stats_off=-1)
    desc = torch.tensor([fields.get(name, 0) for name in LINEAR_FIELDS], dtype=torch.int64, device=w.device)
    act = torch.empty(n // 2, dtype=torch.bfloat16, device=w.device)
    stats = torch.full((1,), float(k), device=w.device)  # a row's sum of squares: 1/rms = 1
    claim = torch.zeros(1, dtype=torch.int32, device=w.device)
    done = torch.zeros(1, dtype=torch.int32, device=w.device)

    def launch():
        claim.zero_()
        done.zero_()
        gemv_units[(variant.programs,)](w, x, out, n, k, repeat, tasks, desc, act, stats, claim, done, KU=variant.ku,
                                        BN=variant.bn, BK=variant.bk, STAGES=variant.stages,
                                        DOT=variant.body == "dot", DESCS=variant.descs, EPILOGUE=variant.epilogue,
                                        CLAIMED=variant.claimed, WAITS=variant.waits, ROW_WORDS=tasks.shape[1],
                                        DESC_WORDS=len(desc),
                                        num_warps=4)
    launch()
    torch.cuda.synchronize()
    ref = (w.float() @ x.float())
    err = ((out.sum(0) - ref).norm() / ref.norm()).item()
    ms = median_ms(launch, w.device, num_warmup=2, num_reps=20)
    nbytes = w.numel() * 2 * repeat
    per_program = nbytes / (ms * 1e-3) / variant.programs / 1e9
    print(f"{label:5s} {variant.body} bn={variant.bn:3d} bk={variant.bk:4d} stages={variant.stages} "
          f"programs={variant.programs} descs={variant.descs} epilogue={variant.epilogue} claimed={variant.claimed} "
          f"waits={variant.waits} passes={repeat}: "
          f"{ms:8.3f} ms  {nbytes / ms / 1e9:6.2f} TB/s  "
          f"{per_program:5.1f} GB/s a program  ({100 * nbytes / ms / 1e9 / bw:5.1f}% of DRAM)  rel err {err:.1e}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="fma fma,descs=1 fma,epilogue=1 fma,claimed=1 "
                        "fma,descs=1,epilogue=1,claimed=1 fma,bn=16,bk=256,stages=5 dot,bn=64,bk=128")
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
        # twice the programs may not all fit co-resident (the FMA body's registers): a wait would never be met
        for programs in (variant.programs, ) if variant.waits else (variant.programs, 2 * variant.programs):
            v = replace(variant, programs=programs)
            run(v, small, x, 40, bw, "L2")
            run(v, large, x, variant.passes, bw, "DRAM")


if __name__ == "__main__":
    main()
