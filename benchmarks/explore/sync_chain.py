"""What does one group boundary cost, and which way of handing a vector from every program to every program is
the fastest? (probe, not the kernel)

At batch 1 a Llama-3-8B layer is six groups, each waiting for all of the one before: QKV, attention, merge,
o_proj, gate/up, down. `profile_step` puts 2-4 us at every boundary, and a weight ring that streams across the
waits did not hide them (NOTES, session 21): what is left is the latency of the hand-over itself. This probe
times that alone. `--programs` programs (2 an SM) run `--passes` passes; in each, every program writes its 16
values of a vector and then needs every program's values of that pass before its next. Ways to hand over:

- `counter` (the megakernel's): the 16 stores, a barrier, one release add to a counter; the consumer polls the
  counter with acquire adds until it reaches programs x pass, then loads the vector (`.cg`).
- `ldacq`: the same, polled with `ld.acquire.gpu` loads instead of atomic adds.
- `flags`: a word a program, stored with release; the consumer loads every program's word (acquire) in one
  vector load until all reach the pass, then loads the vector.
- `volatile`: the megakernel's counter, polled with plain (volatile) loads and one acquire fence once seen.
- `sharded`: SHARDS counters, a program adding to one (its index modulo SHARDS), each in a line of its own; the
  consumer loads them all in one volatile vector load until their sum is reached, then fences.
- `tagged`: no counter. Each value goes out as one 32-bit word, the bf16 bits under a 16-bit pass tag, so a
  word is either old or new as a whole. The consumer loads the vector itself (volatile) until every tag is the
  pass's: the poll and the input's load are one trip, and the producer needs no release fence.

`work=N` adds N KB of streamed weights a program after each hand-over (from a buffer that stays in L2), as a
task would. Each pass reads another program's value, so a stale read shows as a wrong result at the end.

    python -m benchmarks.explore.sync_chain                         # on an H100 / H200
    python -m benchmarks.explore.sync_chain --variants "counter tagged,work=64"
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms
from benchmarks.explore.variant_fields import with_kind

MODES = ("counter", "ldacq", "flags", "tagged", "volatile", "sharded")
PER = 16  # values a program writes each pass
SHARDS = 8  # counters of `sharded`, each in a 128-byte line of its own


@triton.jit
def ld_acquire(ptr):
    """`ld.acquire.gpu` of each int32 at ptr (a scalar or a tensor of pointers)."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def fence_acquire(x):
    """`fence.acq_rel.gpu` (x passes through): what a relaxed poll that has seen its value needs before loading
    what the release published."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def chain(X, COUNTER, FLAGS, W, passes, N, MODE: tl.constexpr, NP: tl.constexpr, PP: tl.constexpr,
          WORK_CHUNKS: tl.constexpr, SPIN_LIMIT: tl.constexpr, SHARDS_C: tl.constexpr):
    """X: [2, N] int32 (two vectors, one a pass in turn), each word a bf16 value's bits (tagged: under its pass's
    tag). Program p writes words p * 16 .. p * 16 + 15 of pass i: word (p * 16 + j + 16) % N of pass i - 1,
    plus one. W: [programs, WORK_CHUNKS, 16, 256] bf16, the work."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    offs = tl.arange(0, NP)
    ok_offs = offs < N
    mine = pid * 16 + tl.arange(0, 16)
    src = (mine + 16) % N
    lanes = tl.arange(0, 16)
    ks = tl.arange(0, 256)
    spins = 0
    for i in range(1, passes + 1):
        prev = X + ((i - 1) % 2) * N
        # the hand-over: every program's words of pass i - 1 (pass 0: the initial vector, ready)
        if MODE == 3:  # tagged: poll the vector itself
            tag = (i - 1) & 0x7FFF
            w = tl.load(prev + offs, mask=ok_offs, other=tag << 16, volatile=True)
            while (tl.min(((w >> 16) == tag).to(tl.int32)) == 0) & (spins < SPIN_LIMIT):
                w = tl.load(prev + offs, mask=ok_offs, other=tag << 16, volatile=True)
                spins += 1
            tl.debug_barrier()
            x = w & 0xFFFF
            mine_prev = tl.load(prev + src, volatile=True) & 0xFFFF
        else:
            if i > 1:
                if MODE == 0:
                    seen = tl.atomic_add(COUNTER, 0, sem="acquire")
                    while (seen < P * (i - 1)) & (spins < SPIN_LIMIT):
                        seen = tl.atomic_add(COUNTER, 0, sem="acquire")
                        spins += 1
                elif MODE == 1:
                    seen = ld_acquire(COUNTER)
                    while (seen < P * (i - 1)) & (spins < SPIN_LIMIT):
                        seen = ld_acquire(COUNTER)
                        spins += 1
                elif MODE == 4:
                    seen = tl.load(COUNTER, volatile=True)
                    while (seen < P * (i - 1)) & (spins < SPIN_LIMIT):
                        seen = tl.load(COUNTER, volatile=True)
                        spins += 1
                    spins += fence_acquire(seen) * 0
                elif MODE == 5:
                    shard = COUNTER + 32 * tl.arange(0, SHARDS_C)
                    seen = tl.sum(tl.load(shard, volatile=True))
                    while (seen < P * (i - 1)) & (spins < SPIN_LIMIT):
                        seen = tl.sum(tl.load(shard, volatile=True))
                        spins += 1
                    spins += fence_acquire(seen) * 0
                else:
                    pr = tl.arange(0, PP)
                    f = ld_acquire(FLAGS + tl.minimum(pr, P - 1))
                    while (tl.min(f) < i - 1) & (spins < SPIN_LIMIT):
                        f = ld_acquire(FLAGS + tl.minimum(pr, P - 1))
                        spins += 1
                tl.debug_barrier()
            x = tl.load(prev + offs, mask=ok_offs, other=0, cache_modifier=".cg") & 0xFFFF
            mine_prev = tl.load(prev + src, cache_modifier=".cg") & 0xFFFF
        # the task: WORK_CHUNKS chunks of [16, 256] weights, pipelined, as a GEMV streams them
        acc = tl.zeros((16, 256), tl.float32)
        if WORK_CHUNKS > 0:
            base = W + pid.to(tl.int64) * (WORK_CHUNKS * 16 * 256)
            for c in tl.range(0, WORK_CHUNKS, num_stages=3):
                acc += tl.load(base + c * (16 * 256) + lanes[:, None] * 256 + ks[None, :]).to(tl.float32)
        # whole input and work used, never true: nothing above is dead code
        never = (tl.sum(x) == -7) | (tl.sum(tl.sum(acc, 1)) == -7.5)
        value = (mine_prev.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32) + 1.0 + never.to(tl.float32))
        bits = value.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        out = X + (i % 2) * N
        if MODE == 3:
            tl.store(out + mine, bits | ((i & 0x7FFF) << 16))
        else:
            tl.store(out + mine, bits)
            tl.debug_barrier()  # every thread's stores before the release
            if MODE == 2:
                tl.atomic_xchg(FLAGS + pid, i, sem="release")
            elif MODE == 5:
                tl.atomic_add(COUNTER + 32 * (pid % SHARDS_C), 1, sem="release")
            else:
                tl.atomic_add(COUNTER, 1, sem="release")
    if spins >= SPIN_LIMIT:
        tl.store(COUNTER + 1, 1)  # gave up: the grid was not co-resident, or a hand-over lost a word


@dataclass(frozen=True)
class Variant:
    mode: str = "counter"
    work: int = 0  # KB of weights a program streams after each hand-over
    programs: int = 0  # 0: two an SM

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        return with_kind(cls, spec, MODES)


def run(variant: Variant, passes: int) -> None:
    device = torch.device("cuda")
    programs = variant.programs or 2 * torch.cuda.get_device_properties(device).multi_processor_count
    n = programs * PER
    chunks = variant.work * 1024 // (16 * 256 * 2)
    w = torch.randn(max(1, programs * chunks * 16 * 256), device=device).to(torch.bfloat16)
    x = torch.empty(2, n, dtype=torch.int32, device=device)
    counter = torch.zeros(32 * SHARDS, dtype=torch.int32, device=device)
    flags = torch.zeros(programs, dtype=torch.int32, device=device)
    one = torch.tensor(1.0, dtype=torch.bfloat16).view(torch.int16).item() & 0xFFFF

    def launch(num_passes: int):
        x[0].fill_(one)  # pass 0, tag 0
        x[1].fill_(-1)  # no pass's tag
        counter.zero_()
        flags.zero_()
        chain[(programs,)](x, counter, flags, w, num_passes, n, MODE=MODES.index(variant.mode),
                           NP=triton.next_power_of_2(n), PP=triton.next_power_of_2(programs), WORK_CHUNKS=chunks,
                           SPIN_LIMIT=1 << 22, SHARDS_C=SHARDS, num_warps=4)

    launch(passes)
    torch.cuda.synchronize()
    values = (x[passes % 2] & 0xFFFF).to(torch.int16).view(torch.bfloat16).float()
    right = bool((values == 1 + passes).all()) and counter[1].item() == 0
    ms = {p: median_ms(lambda p=p: launch(p), device, num_warmup=2, num_reps=15) for p in (passes // 2, passes)}
    per_pass = (ms[passes] - ms[passes // 2]) / (passes - passes // 2) * 1e3
    print(f"{variant.mode:8s} work={variant.work:4d} KB programs={programs}: {per_pass:6.2f} us a pass "
          f"({ms[passes]:.3f} ms for {passes}){'' if right else '  WRONG RESULT or gave up'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="counter ldacq flags tagged counter,work=64 ldacq,work=64 "
                        "flags,work=64 tagged,work=64 counter tagged")
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for spec in args.variants.split():
        run(Variant.parse(spec), args.passes)


if __name__ == "__main__":
    main()
