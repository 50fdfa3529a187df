"""Are some SMs slower at streaming weights, and would parts sized to each SM's speed end a group sooner? (probe,
not the kernel)

At batch 1 the megakernel shares a streamed group's work (gate/up, the LM head) out evenly, one contiguous range
a program (`gemv_stream`). `profile_step` showed the equal parts of one gate/up taking 53.8-61.7 us, with the same
programs slow in every layer, and the next group waits for the slowest. This probe streams gate/up's shape alone
(`--rows` x `--cols` bf16 weights, [16, 512] chunks, `--stages` deep) on `--programs` programs and records each
program's SM (`%smid`) and time:

1. equal parts, `--reps` launches: each SM's time a unit, how well two halves of the launches agree on it
   (correlation), and how the SMs' speeds spread;
2. parts sized to each SM's speed in (1): a program finds its SM's range in a table (a slot counter an SM puts
   its programs in order), so the same SM gets the same share whatever program lands there.

It prints the group's time (first start to last end, global timer) both ways: the gain SM-weighted parts would
bring a streamed group, before building them into the kernel.

    python -m benchmarks.explore.sm_speed                 # on an H100 / H200
    python -m benchmarks.explore.sm_speed --dump P-b1-c512.pt   # ... and the kernel's SMs (`profile_step --dump P`)

`--dump` also reads a profiled step of the megakernel and compares each SM's time in the streamed groups (each
task's busy time over its group's median) with the probe's.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from codegen.tasks import Kind

BN, BK = 16, 512


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _sm():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def stream(W, X, OUT, BOUNDS, SLOTS, TIMES, K, N, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr):
    """Program p takes its SM's next slot s and streams units BOUNDS[2 sm + s] .. BOUNDS[2 sm + s + 1] of the [N, K]
    weights (unit: a [BN, BK] chunk, tile by tile, as `gemv_stream`); TIMES[p] = (start, end, sm)."""
    pid = tl.program_id(0)
    sm = _sm()
    slot = tl.atomic_add(SLOTS + sm, 1)
    start = _now()
    part = sm * 2 + slot
    u0 = tl.load(BOUNDS + part)
    u1 = tl.load(BOUNDS + part + 1)
    chunks = K // BK
    lanes = tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BN, BK), tl.float32)
    total = tl.zeros((BN,), tl.float32)
    for u in tl.range(u0, u1, num_stages=STAGES):
        j = u // chunks
        k0 = (u - j * chunks) * BK
        w = tl.load(W + (j.to(tl.int64) * BN * K + k0) + lanes[:, None] * K + ks[None, :])
        x = tl.load(X + k0 + ks).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        if u - j * chunks == chunks - 1:
            total += tl.sum(acc, 1)
            acc = acc * 0.0
    tl.store(OUT + pid * BN + lanes, total + tl.sum(acc, 1))
    tl.debug_barrier()
    tl.store(TIMES + pid * 3, start)
    tl.store(TIMES + pid * 3 + 1, _now())
    tl.store(TIMES + pid * 3 + 2, sm.to(tl.int64))


def bounds_for(weights: torch.Tensor, units: int) -> torch.Tensor:
    """Cumulative unit boundaries of the parts (2 an SM, in SM order) from each part's weight."""
    cum = torch.cat([torch.zeros(1, dtype=torch.float64), weights.double().cumsum(0)])
    return (cum / cum[-1] * units).round().long().to(torch.int32)


def launch(w, x, out, bounds, slots, times, programs, stages, K, N) -> torch.Tensor:
    """One launch over parts `bounds`: [programs, 3] (start, end, SM) a program."""
    slots.zero_()
    stream[(programs,)](w, x, out, bounds, slots, times, K, N, BN=BN, BK=BK, STAGES=stages, num_warps=4)
    torch.cuda.synchronize()
    return times.view(programs, 3).cpu()


def kernel_sm_times(path: str, sms: int) -> torch.Tensor:
    """Each SM's mean busy time in the dump's projections of one task a program (the streamed groups at batch 1),
    over the group's median; NaN for SMs that ran none."""
    dump = torch.load(path)
    times, tasks = dump["times"], dump["tasks"]
    programs = dump["programs"]
    ran = times[:, 0] > 0
    total = torch.zeros(sms, dtype=torch.float64)
    count = torch.zeros(sms, dtype=torch.float64)
    for event in tasks[ran, 3].unique().tolist():
        members = torch.nonzero(ran & (tasks[:, 3] == event)).flatten()
        if len(members) != programs or int(tasks[members[0], 0]) != Kind.LINEAR:
            continue
        busy = (times[members, 2] - times[members, 1]).double()
        ratio = busy / busy.median()
        total.index_add_(0, times[members, 4].long(), ratio)
        count.index_add_(0, times[members, 4].long(), torch.ones_like(ratio))
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=28672)  # Llama-3-8B gate/up
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--dump", help="a `profile_step --dump` file of a batch-1 step to compare with")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = 2 * sms
    N, K = args.rows, args.cols
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(programs * BN, device="cuda", dtype=torch.float32)
    slots = torch.zeros(sms, device="cuda", dtype=torch.int32)
    times = torch.zeros(programs * 3, device="cuda", dtype=torch.int64)
    flush = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    units = N // BN * (K // BK)
    print(f"{torch.cuda.get_device_name(0)}: {programs} programs, {N} x {K} bf16 ({N * K * 2 / 1e6:.0f} MB), "
          f"{units} units of [{BN}, {BK}]")

    def measured(weights, label):
        bounds = bounds_for(weights, units)
        spans, sm_time = [], torch.zeros(args.reps, sms, dtype=torch.float64)
        for rep in range(args.reps):
            flush.zero_()  # the weights come from DRAM, as in the kernel
            t = launch(w, x, out, bounds.cuda(), slots, times, programs, args.stages, K, N)
            spans.append(int(t[:, 1].max() - t[:, 0].min()) / 1e3)
            for p in range(programs):  # each SM's time for its units, summed over its two programs
                sm_time[rep, int(t[p, 2])] += float(t[p, 1] - t[p, 0])
        sm_units = (bounds[1:] - bounds[:-1]).double().view(sms, 2).sum(1)
        spans.sort()
        bytes_ = N * K * 2
        print(f"{label}: group span median {spans[len(spans) // 2]:.1f} us (min {spans[0]:.1f}, "
              f"{bytes_ / spans[len(spans) // 2] / 1e6:.2f} TB/s)")
        return sm_time, sm_units

    equal = torch.ones(programs)
    sm_time, sm_units = measured(equal, "equal parts")
    rate = sm_time / sm_units  # ns a unit, per launch and SM (two programs)
    half = args.reps // 2
    a, b = rate[:half].mean(0), rate[half:].mean(0)
    corr = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
    mean = rate.mean(0)
    order = mean.argsort()
    print(f"ns a unit a SM: fastest {mean[order[0]]:.0f}, median {mean[order[sms // 2]]:.0f}, slowest "
          f"{mean[order[-1]]:.0f}; the two halves' per-SM means correlate {corr:.3f}")
    print("SMs by speed (fastest first):", order.tolist())
    print("ns a unit by SM id:", [round(v) for v in mean.tolist()])
    if args.dump:
        kernel = kernel_sm_times(args.dump, sms)
        seen = ~kernel.isnan()
        corr = torch.corrcoef(torch.stack([kernel[seen], mean[seen]]))[0, 1].item()
        k_order = kernel[seen].argsort()
        print(f"the kernel's streamed parts, busy over the group's median, a SM: fastest {kernel[seen][k_order[0]]:.3f}, "
              f"slowest {kernel[seen][k_order[-1]]:.3f}; correlation with the probe's ns a unit {corr:.3f}")
    speed = (1 / mean).repeat_interleave(2)
    measured(speed, "parts sized to each SM's speed")
    measured(equal, "equal parts, again")


if __name__ == "__main__":
    main()
