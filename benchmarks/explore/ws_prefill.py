"""Do a prefill's projection tiles reach cuBLAS in a persistent warp-specialized kernel, one program an SM? (Gluon)

The megakernel's prefill tiles are [128, 128] on two 4-warp programs an SM, bound by what they read from L2 (~7-12
TB/s over the SMs, benchmarks/explore/NOTES.md sessions 46 and 53), and every wider tile or deeper pipeline lost to
the registers and shared memory the decode bodies share with them (sessions 31-36, 56). cuBLAS reads a third fewer
bytes a flop with [128, 256] tiles on warp-specialized programs (a producer warp, two consumer warp groups with
their own register budgets through `setmaxnreg`). This probe is that structure in Gluon, the form a warp-
specialized megakernel would take:

- a loader warp (few registers) walks the program's tiles and copies each K chunk of the activations [BM, BK] and
  the weights [BN, BK] through TMA into a ring of STAGES slots; it waits only for a free slot, so it runs on into the
  next tile while the consumers finish this one's epilogue;
- the default partition (`--warps`, 8: two warp groups) multiplies each chunk on the tensor cores (`wgmma`, one in
  flight), then the epilogue: bf16, or for gate/up's tiles (columns alternating gate, up, as the megakernel lays
  them) silu(gate) * up, half the columns; through shared memory and one TMA store.

Tiles go out to the programs round-robin in a grouped order (GROUP row blocks share each column block in time), or
(a variant's `/c`) every tile after a program's first is claimed by its loader from a counter and queued to the
consumers, as the megakernel's claimed tasks would have to be. Where the tiles are fewer than the programs (few
rows) their K is split, each split's fp32 partial stored (the sum left out of the time). A kernel may also hold a
decode GEMV that streams the same weights through the same ring (`gluon_probe.gemv_load` / `gemv_consume`): every
variant is built with the tiles, the GEMV, or both, to see what each costs the other.

The shapes are Llama-3-8B's four projections at a prompt of `--tokens`; each is checked against torch's product and
timed against `torch.matmul` (cuBLAS) of the same shapes, in the same run (CUDA graphs of `--reps` launches each).

    python -m benchmarks.explore.ws_prefill                   # on an H100 / H200
    python -m benchmarks.explore.ws_prefill --compile-only    # here, no GPU: compile for sm_90, print resources
"""
import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.explore.gluon_probe import (compile_sm90, gemv_consume, gemv_load, graph_ms, probe_header,
                                            projection_inputs)


@triton.constexpr_function
def _acc_layout(bm, bn, warps):
    """The wgmma accumulator's layout: warps along M, 16 rows each, as many as the rows take; the rest along N."""
    wm = min(warps, bm // 16)
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[wm, warps // wm],
                                     instr_shape=[16, bn // (warps // wm), 16])


@gluon.jit
def _tile(t, num_m, num_n, splits, GROUP: gl.constexpr):
    """Tile t's (row block, column block, K split) in the grouped order: GROUP row blocks take each column block in
    turn, a tile's K splits one after another."""
    ks = t % splits
    t = t // splits
    per_group = GROUP * num_n
    first = (t // per_group) * GROUP
    rows = gl.minimum(num_m - first, GROUP)
    return first + (t % per_group) % rows, (t % per_group) // rows, ks


@gluon.jit
def _push(queue, q_ready, q_empty, j, t, Q: gl.constexpr):
    """The loader hands tile index t (or -1, the end) to the consumers: the j-th entry of a queue of Q."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    mbarrier.wait(q_empty.index(j % Q), ((j // Q) & 1) ^ 1)
    queue.index(j % Q).store(gl.full([1], t, gl.int32, one))
    mbarrier.arrive(q_ready.index(j % Q), count=1)


@gluon.jit
def _pop(queue, q_ready, q_empty, j, Q: gl.constexpr):
    """The consumers' j-th tile index from the loader's queue."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    mbarrier.wait(q_ready.index(j % Q), (j // Q) & 1)
    t = gl.sum(queue.index(j % Q).load(one), axis=0)
    mbarrier.arrive(q_empty.index(j % Q), count=1)
    return t


@gluon.jit
def _loader(x_desc, w_desc, g_desc, a_ring, b_ring, g_ring, ready, empty, queue, q_ready, q_empty, claims, num_m,
            num_n, splits, N, K, run_prefill, run_decode, pid, P, BM: gl.constexpr, BN: gl.constexpr,
            BK: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr, PREFILL: gl.constexpr, DECODE: gl.constexpr,
            CLAIM: gl.constexpr, Q: gl.constexpr):
    i = 0
    if PREFILL:
        if run_prefill:
            KS = K // splits
            total = num_m * num_n * splits
            t = pid
            j = 0  # tiles handed to the consumers
            while t < total:
                if CLAIM:  # the tile's index to the consumers, through the queue
                    _push(queue, q_ready, q_empty, j, t, Q)
                    j += 1
                m, n, ks = _tile(t, num_m, num_n, splits, GROUP)
                for k in range(ks * KS, ks * KS + KS, BK):
                    s = i % STAGES
                    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # (a barrier starts as if phase 1 were done)
                    mbarrier.expect(ready.index(s), (BM + BN) * BK * 2)
                    tma.async_copy_global_to_shared(x_desc, [m * BM, k], ready.index(s), a_ring.index(s))
                    tma.async_copy_global_to_shared(w_desc, [n * BN, k], ready.index(s), b_ring.index(s))
                    i += 1
                if CLAIM:  # the next tile claimed once this one's copies are all asked for
                    t = P + gl.atomic_add(claims, 1)
                else:
                    t += P
            if CLAIM:
                _push(queue, q_ready, q_empty, j, -1, Q)
    if DECODE:
        if run_decode:
            gemv_load(g_desc, g_ring, ready, empty, 0, i, pid, P, N, K, STAGES)


@gluon.jit
def _consumer(y_desc, a_ring, b_ring, g_ring, ready, empty, c_smem, queue, q_ready, q_empty, xv, yv, num_m, num_n,
              splits, N, K, run_prefill, run_decode, pid, P, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
              STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr, SPLIT: gl.constexpr,
              PREFILL: gl.constexpr, DECODE: gl.constexpr, CLAIM: gl.constexpr, Q: gl.constexpr):
    i = 0
    if PREFILL:
        if run_prefill:
            i = _tiles(y_desc, a_ring, b_ring, ready, empty, c_smem, queue, q_ready, q_empty, num_m, num_n, splits,
                       K, pid, P, i, BM, BN, BK, STAGES, GROUP, GATED, SPLIT, CLAIM, Q)
    if DECODE:
        if run_decode:
            gemv_consume(xv, yv, g_ring, ready, empty, 0, i, pid, P, N, K, STAGES)


@gluon.jit
def _tiles(y_desc, a_ring, b_ring, ready, empty, c_smem, queue, q_ready, q_empty, num_m, num_n, splits, K, pid, P, i,
           BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr,
           GATED: gl.constexpr, SPLIT: gl.constexpr, CLAIM: gl.constexpr, Q: gl.constexpr):
    """The prefill tiles (SPLIT: each K split's fp32 partial stored, its rows at ks * M, not summed); returns the
    ring's count. CLAIM: the tiles as the loader claimed them, from its queue (-1 ends them); else every P-th."""
    acc_layout: gl.constexpr = _acc_layout(BM, BN, gl.num_warps())
    OUT: gl.constexpr = BN // 2 if GATED else BN
    KS = K // splits
    total = num_m * num_n * splits
    j = 0
    if CLAIM:
        t = _pop(queue, q_ready, q_empty, j, Q)
    else:
        t = pid
    while (t >= 0) & (t < total):
        m, n, ks = _tile(t, num_m, num_n, splits, GROUP)
        acc = gl.zeros([BM, BN], gl.float32, acc_layout)
        for k in range(ks * KS, ks * KS + KS, BK):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
            # one product in flight: the one before this is done, so its slot goes back to the loader
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > ks * KS)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
        if GATED:
            gate, up = gl.split(gl.reshape(acc, [BM, OUT, 2]))
            y = gate / (1.0 + gl.exp(-gate)) * up
        else:
            y = acc
        tma.store_wait(pendings=0)  # the tile before has left c_smem
        c_smem.store(y.to(c_smem.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [(ks * num_m + m) * BM, n * OUT], c_smem)
        j += 1
        if CLAIM:
            t = _pop(queue, q_ready, q_empty, j, Q)
        else:
            t += P
    tma.store_wait(pendings=0)
    return i


@gluon.jit
def ws_linear(x, w, y, part, xv, yv, claims, M, N, K, splits, run_prefill, run_decode, BM: gl.constexpr,
              BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr,
              SPLIT: gl.constexpr, LOADER_REGS: gl.constexpr, PREFILL: gl.constexpr, DECODE: gl.constexpr,
              CLAIM: gl.constexpr):
    """Prefill (run_prefill): y[M, N'] = x[M, K] @ w[N, K]^T (N' = N, or N / 2 gated), persistent over [BM, BN]
    tiles. Decode (run_decode): yv[N] = w @ xv, a row's GEMV through the same ring. PREFILL / DECODE: which of the
    two the kernel holds at all (a kernel with both is what a megakernel is)."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    OUT: gl.constexpr = BN // 2 if GATED else BN
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    x_desc = tma.make_tensor_descriptor(x, [M, K], [K, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [BN, BK], b_layout)
    if SPLIT:  # fp32 partials, a K split's rows after another's
        c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.float32)
        y_desc = tma.make_tensor_descriptor(part, [splits * M, N], [N, 1], [BM, BN], c_layout)
        c_smem = gl.allocate_shared_memory(gl.float32, [BM, BN], c_layout)
    else:
        c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, OUT], gl.bfloat16)
        y_desc = tma.make_tensor_descriptor(y, [M, N // 2 if GATED else N], [N // 2 if GATED else N, 1],
                                            [BM, OUT], c_layout)
        c_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, OUT], c_layout)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_layout)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_layout)
    # the decode GEMV's view of the weight slots: [GR, GK] chunks, GK = 256 (a TMA box's widest, unswizzled)
    GK: gl.constexpr = 256
    GR: gl.constexpr = BN * BK // GK
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    g_ring = b_ring._reinterpret(gl.bfloat16, [STAGES, GR, GK], plain)
    g_desc = tma.make_tensor_descriptor(w, [N, K], [K, 1], [GR, GK], plain)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    # CLAIM: a program's first tile is its own (tile pid), every later one claimed by its loader from `claims`
    # (tile P + the count before) once it has asked for all of the tile before's chunks, and handed to the
    # consumers through a queue of Q indices: the megakernel's claimed tasks, decided where the copies start
    Q: gl.constexpr = 4
    queue = gl.allocate_shared_memory(gl.int32, [Q, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [Q, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(Q):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=1)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    gl.warp_specialize([
        (_consumer, (y_desc, a_ring, b_ring, g_ring, ready, empty, c_smem, queue, q_ready, q_empty, xv, yv, num_m,
                     num_n, splits, N, K, run_prefill, run_decode, pid, P, BM, BN, BK, STAGES, GROUP, GATED, SPLIT,
                     PREFILL, DECODE, CLAIM, Q)),
        (_loader, (x_desc, w_desc, g_desc, a_ring, b_ring, g_ring, ready, empty, queue, q_ready, q_empty, claims,
                   num_m, num_n, splits, N, K, run_prefill, run_decode, pid, P, BM, BN, BK, STAGES, GROUP, PREFILL,
                   DECODE, CLAIM, Q)),
    ], [1], [LOADER_REGS])


def variants(spec):
    """'128x256x64/3,128x256x64/3/c,...' -> [(BM, BN, BK, STAGES, CLAIM)] (c: tiles claimed by the loader)."""
    out = []
    for v in spec.split(","):
        tile, stages, *claim = v.split("/")
        bm, bn, bk = (int(d) for d in tile.split("x"))
        out.append((bm, bn, bk, int(stages), claim == ["c"]))
    return out


BUILDS = {"prefill": (True, False), "decode": (False, True), "both": (True, True)}  # what a kernel holds


def options(bm, bn, bk, stages, gated, warps, group, build, split=False, claim=False):
    # a worker warp's group gets LOADER_REGS a thread, the default partition what maxnreg leaves: one program an SM
    prefill, decode = BUILDS[build]
    return dict(BM=bm, BN=bn, BK=bk, STAGES=stages, GROUP=group, GATED=gated and not split, SPLIT=split,
                LOADER_REGS=40, PREFILL=prefill, DECODE=decode, CLAIM=claim, num_warps=warps,
                maxnreg=65536 // ((warps + 4) * 32) // 8 * 8)


def compile_only(specs, warps, group):
    sig = {"x": "*bf16", "w": "*bf16", "y": "*bf16", "part": "*fp32", "xv": "*bf16", "yv": "*bf16",
           "claims": "*i32", "M": "i32", "N": "i32", "K": "i32", "splits": "i32", "run_prefill": "i32",
           "run_decode": "i32"}
    for bm, bn, bk, stages, claim in specs:
        for gated in (False, True):
            for build in (["prefill"] if claim else BUILDS):
                compile_sm90(ws_linear, sig, options(bm, bn, bk, stages, gated, warps, group, build, claim=claim),
                             f"{bm}x{bn}x{bk}/{stages}{'/c' if claim else ''} gated={gated} {build}")


def auto_splits(tokens, n, k, bm, bn, bk, sms):
    """The fewest K splits (a power of two) that give every program a tile, each split whole chunks of bk."""
    tiles, splits = -(-tokens // bm) * -(-n // bn), 1
    while tiles * splits < sms and k % (2 * splits * bk) == 0:
        splits *= 2
    return splits


def run_gpu(specs, tokens, warps, group, reps, shapes, min_splits=1, max_splits=0, builds=tuple(BUILDS)):
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = probe_header(f"one program an SM, {warps} consumer warps + a loader warp; {tokens} tokens")
    for name, n, k, gated, x, w, xv, product, ref, ref_v in projection_inputs(shapes, tokens):
        flop = 2 * tokens * n * k
        cublas_ms = graph_ms(lambda: torch.matmul(x, w.T), reps)
        gemv_ms = graph_ms(lambda: torch.matmul(w, xv), reps)
        line = (f"{name:8s} [{tokens}, {k}] x [{n}, {k}]^T: cuBLAS {cublas_ms * 1e3:7.1f} us "
                f"({flop / cublas_ms / 1e9:5.0f} TFLOP/s)")
        if gated:  # torch's MLP: the product, then silu(gate) * up in a kernel of its own
            gated_ms = graph_ms(lambda: (lambda h: torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2])(
                torch.matmul(x, w.T)), reps)
            line += f", with silu * up {gated_ms * 1e3:7.1f} us"
        print(line + f"; one row's GEMV {gemv_ms * 1e3:6.1f} us ({w.numel() * 2 / gemv_ms / 1e9:4.2f} TB/s)",
              flush=True)
        y = torch.empty(tokens, n // 2 if gated else n, device=dev, dtype=torch.bfloat16)
        yv = torch.empty(n, device=dev, dtype=torch.bfloat16)
        claims = torch.zeros(1, device=dev, dtype=torch.int32)
        for bm, bn, bk, stages, claim in specs:
            splits = auto_splits(tokens, n, k, bm, bn, bk, sms)
            while 1 < splits < min_splits and k % (2 * splits * bk) == 0:  # finer splits: more, shorter tiles
                splits *= 2
            splits = min(splits, max_splits or splits)
            part = torch.empty(splits * -(-tokens // bm) * bm, n, device=dev, dtype=torch.float32)
            for build, (has_prefill, has_decode) in BUILDS.items():
                if claim and build != "prefill" or build not in builds:
                    continue
                opts = options(bm, bn, bk, stages, gated, warps, group, build, split=splits > 1, claim=claim)
                for run in [r for r, on in (("prefill", has_prefill), ("decode", has_decode)) if on]:
                    flags = (int(run == "prefill"), int(run == "decode"))

                    def launch():
                        if claim:
                            claims.zero_()
                        ws_linear[(sms, )](x, w, y, part, xv, yv, claims, tokens, n, k, splits, *flags, **opts)
                    tag = (f"{name:8s} {bm}x{bn}x{bk}/{stages}{f' split {splits}' if splits > 1 else ''}"
                           f"{' claimed' if claim else ''} {run:7s} in a kernel of {build:7s}")
                    try:
                        y.fill_(float("nan"))
                        yv.fill_(float("nan"))
                        launch()
                        torch.cuda.synchronize()
                    except Exception as exc:  # a variant that does not compile or launch: say so, go on
                        print(f"  {tag}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                        continue
                    if run == "decode":
                        out, want = yv, ref_v
                    elif splits > 1:  # the partials' sum (not timed: the probe times the tiles alone)
                        out, want = part.view(splits, -1, n)[:, :tokens].sum(0), product
                    else:
                        out, want = y, ref
                    err = ((out.float() - want).norm() / want.norm()).item()
                    ms = graph_ms(launch, reps)
                    kernel = ws_linear.warmup(x, w, y, part, xv, yv, claims, tokens, n, k, splits, *flags,
                                              grid=(sms, ), **opts)
                    rate = (f"{flop / ms / 1e9:5.0f} TFLOP/s, {cublas_ms / ms:.2f}x cuBLAS, weights at "
                            f"{w.numel() * 2 / ms / 1e9:4.2f} TB/s" if run == "prefill" else
                            f"{w.numel() * 2 / ms / 1e9:4.2f} TB/s, {w.numel() * 2 / ms / 1e9 / bw:.0%} of BW")
                    print(f"RESULT {tag}: {ms * 1e3:7.1f} us ({rate}) rel_err {err:.1e} regs {kernel.n_regs} "
                          f"spills {kernel.n_spills} shared {kernel.metadata.shared}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--variants", default="128x256x64/3,128x256x64/3/c,128x128x64/4",
                        help="BMxBNxBK/STAGES[/c], comma-separated (c: the tiles claimed by the loader)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--warps", type=int, default=8, help="warps of the consumer (default) partition")
    parser.add_argument("--group", type=int, default=8, help="row blocks that share a column block in time")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--shapes", default="", help="only these projections (comma-separated names)")
    parser.add_argument("--min-splits", type=int, default=1, help="split K at least this many ways where the tiles "
                        "are split at all (a power of two; the rule splits only as far as fills the programs)")
    parser.add_argument("--max-splits", type=int, default=0, help="split K at most this many ways (1: whole-K "
                        "tiles only, however few; 0: no cap)")
    parser.add_argument("--builds", default=",".join(BUILDS), help="the kernels built: prefill, decode, both")
    args = parser.parse_args()
    specs = variants(args.variants)
    if args.compile_only:
        compile_only(specs, args.warps, args.group)
    else:
        run_gpu(specs, args.tokens, args.warps, args.group, args.reps, [s for s in args.shapes.split(",") if s],
                args.min_splits, args.max_splits, tuple(args.builds.split(",")))


if __name__ == "__main__":
    main()
