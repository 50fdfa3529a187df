"""Does a weight ring that streams on across the dependency waits lift the persistent GEMV chain? (Gluon probe)

The persistent chain of `persistent_gemv.py` (Llama-3-8B's 128 decode GEMVs, event counters between them) reaches
87% of the H200's read bandwidth with its waits and 95-97% without: every matrix boundary drains each program's
pipeline, and it refills only after the wait (about 2.3 us a boundary). Plain Triton cannot keep the weights
streaming across a wait, since its pipeliner hoists the input loads with the weights'. Here each program is
warp-specialized in Gluon (Triton 3.6's explicit-layout dialect, Hopper only):

- a producer warp walks the program's (layer, matrix, unit, chunk) sequence and copies each [BN, BK] weight chunk
  into a ring of RING shared-memory slots through TMA. It never waits on an event, only for a free slot, so it
  runs up to RING chunks ahead of the consumer, across matrix boundaries;
- an input warp waits (acquire) until the matrix before is complete, then copies the input vector into shared
  memory (TMA) once per matrix for all of the program's units of it;
- the default partition (4 warps) multiplies: each chunk from the ring times the input, a [BN] result a unit,
  stored, then released on the matrix's counter.

Activations are bf16, one vector a matrix in the layout of `persistent_gemv.layout` (no split K). The check
compares each matrix's output with the fp32 product of its weights and its own stored input. `--attention-us`
holds each layer's o_proj input back that long after QKV completes (a layer's attention, as a latency), to see how
much of it the producer's run-ahead hides (session 59: none).

    python -m benchmarks.explore.ws_gemv                  # on an H100 / H200: times it (and its NOWAIT bound)
    python -m benchmarks.explore.ws_gemv --compile-only   # here, no GPU: compile for sm_90, print resources
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from benchmarks.baselines import read_bandwidth_tbs
from benchmarks.explore.persistent_gemv import FULL, Problem, bench, in_off, layout
from benchmarks.explore.gluon_probe import compile_sm90, use_global_scratch

UNIT_ROWS, CHUNK = 16, 256  # a unit's weight rows, a chunk's columns: 8 KB of weights a chunk
COPY_WIDTH, COPY_ROWS = 256, 8  # the input vector is copied as rows of COPY_WIDTH elements, COPY_ROWS rows a copy
BN, BK, XW, XR = (gl.constexpr(v) for v in (UNIT_ROWS, CHUNK, COPY_WIDTH, COPY_ROWS))  # (as the kernels see them)
MAX_SPIN = 1 << 20  # polls before a wait gives up (sets the error flag)


def regs_per_thread(per_sm, warps):
    """The register cap that fits per_sm programs an SM, each of `warps` warps and a warp group of workers."""
    return min(255, 65536 // (per_sm * 32 * (warps + 4)) // 8 * 8)


@gluon.jit
def _wait_count(cnt, target, err, MAX_SPIN: gl.constexpr):
    """Acquire-polls `cnt` until it reaches target; past MAX_SPIN polls sets the error flag and gives up."""
    seen = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < MAX_SPIN):
        seen = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        gl.atomic_xchg(err, 1)


@gluon.jit
def _spin_ns(ns: gl.constexpr):
    """Waits ns nanoseconds of the global timer."""
    start = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    now = start
    while now - start < ns:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                        pack=1)


@gluon.jit
def _consumer(ring, ready, empty, xbuf, x_ready, x_empty, act, cnt, NL, pid, P, NS: gl.constexpr,
              KS: gl.constexpr, OUT_OFF: gl.constexpr, LSTRIDE: gl.constexpr, RING: gl.constexpr,
              SIGNAL: gl.constexpr):
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    rows: gl.constexpr = gl.SliceLayout(1, blocked)
    i = 0  # chunks taken from the ring
    j = 0  # inputs taken
    for L in range(NL):
        for m in gl.static_range(4):
            if pid < NS[m] // BN:
                mbarrier.wait(x_ready.index(0), j & 1)
                for u in range(pid, NS[m] // BN, P):
                    acc = gl.zeros([BN, BK], gl.float32, blocked)
                    for q in range(KS[m] // (XR * XW)):  # the input's copies, XR chunks each (BK == XW)
                        xq = xbuf.index(q)
                        for r in gl.static_range(XR):
                            s = i % RING
                            mbarrier.wait(ready.index(s), (i // RING) & 1)
                            w = ring.index(s).load(blocked)
                            x = xq.slice(r, 1, dim=0).load(blocked)  # [1, BK]
                            fence_async_shared()  # the slot's reads before the producer's next copy into it
                            mbarrier.arrive(empty.index(s), count=1)
                            acc += w.to(gl.float32) * x.to(gl.float32)
                            i += 1
                    y = gl.sum(acc, axis=1)
                    n = u * BN + gl.arange(0, BN, layout=rows)
                    gl.store(act + L * LSTRIDE + OUT_OFF[m] + n, y.to(gl.bfloat16))
                    if SIGNAL:
                        gl.thread_barrier()  # every warp's stores before the release
                        gl.atomic_add(cnt + L * 4 + m, 1, sem="release", scope="gpu")
                fence_async_shared()
                mbarrier.arrive(x_empty.index(0), count=1)
                j += 1


@gluon.jit
def _worker(descs, x_desc, ring, ready, empty, xbuf, x_ready, x_empty, cnt, err, epoch, NL, pid, P,
            NS: gl.constexpr, KS: gl.constexpr, IN_ROW: gl.constexpr, LROWS: gl.constexpr, RING: gl.constexpr,
            WAIT: gl.constexpr, MAX_SPIN: gl.constexpr, ROLE: gl.constexpr, ATTN_NS: gl.constexpr):
    """ROLE 0: the weight producer; 1: the input loader (the two workers share one signature). ATTN_NS: o_proj's
    input is loaded that long after QKV's outputs are complete (a layer's attention, its latency alone), while the
    producer streams on into the ring."""
    if ROLE == 0:
        i = 0
        for L in range(NL):
            for m in gl.static_range(4):
                for u in range(pid, NS[m] // BN, P):
                    row = L * NS[m] + u * BN
                    for c in range(KS[m] // BK):
                        s = i % RING
                        mbarrier.wait(empty.index(s), ((i // RING) & 1) ^ 1)
                        mbarrier.expect(ready.index(s), BN * BK * 2)
                        tma.async_copy_global_to_shared(descs[m], [row, c * BK], ready.index(s), ring.index(s))
                        i += 1
    else:
        j = 0
        for L in range(NL):
            for m in gl.static_range(4):
                if pid < NS[m] // BN:
                    mbarrier.wait(x_empty.index(0), (j & 1) ^ 1)
                    if WAIT:
                        if L * 4 + m > 0:  # the matrix before (layer 0's first input is given)
                            _wait_count(cnt + L * 4 + m - 1, (NS[(m + 3) % 4] // BN) * epoch, err, MAX_SPIN)
                        if (ATTN_NS > 0) and (m == 1):
                            _spin_ns(ATTN_NS)
                        # the other programs' stores (generic proxy) before this program's copies (async proxy)
                        gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [],
                                                  dtype=gl.int32, is_pure=False, pack=1)
                    mbarrier.expect(x_ready.index(0), KS[m] * 2)
                    for q in gl.static_range(KS[m] // (XR * XW)):
                        tma.async_copy_global_to_shared(x_desc, [L * LROWS + IN_ROW[m] + q * XR, 0], x_ready.index(0),
                                                        xbuf.index(q))
                    j += 1


@gluon.jit
def ws_chain(W0, W1, W2, W3, act, cnt, err, epoch, NL, act_rows, NS: gl.constexpr, KS: gl.constexpr,
             IN_ROW: gl.constexpr, OUT_OFF: gl.constexpr, LSTRIDE: gl.constexpr, RING: gl.constexpr,
             XROWS: gl.constexpr, WAIT: gl.constexpr, SIGNAL: gl.constexpr, MAX_SPIN: gl.constexpr,
             ATTN_NS: gl.constexpr,
             WORKER_REGS: gl.constexpr):
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    plain: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    descs = (tma.make_tensor_descriptor(W0, [NL * NS[0], KS[0]], [KS[0], 1], [BN, BK], plain),
             tma.make_tensor_descriptor(W1, [NL * NS[1], KS[1]], [KS[1], 1], [BN, BK], plain),
             tma.make_tensor_descriptor(W2, [NL * NS[2], KS[2]], [KS[2], 1], [BN, BK], plain),
             tma.make_tensor_descriptor(W3, [NL * NS[3], KS[3]], [KS[3], 1], [BN, BK], plain))
    x_desc = tma.make_tensor_descriptor(act, [act_rows, XW], [XW, 1], [XR, XW], plain)
    ring = gl.allocate_shared_memory(gl.bfloat16, [RING, BN, BK], plain)
    xbuf = gl.allocate_shared_memory(gl.bfloat16, [XROWS // XR, XR, XW], plain)
    ready = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [RING, 1], mbarrier.MBarrierLayout())
    x_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    x_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(RING):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    mbarrier.init(x_ready.index(0), count=1)
    mbarrier.init(x_empty.index(0), count=1)
    LROWS: gl.constexpr = LSTRIDE // XW
    gl.warp_specialize([
        (_consumer, (ring, ready, empty, xbuf, x_ready, x_empty, act, cnt, NL, pid, P, NS, KS, OUT_OFF, LSTRIDE,
                     RING, SIGNAL)),
        (_worker, (descs, x_desc, ring, ready, empty, xbuf, x_ready, x_empty, cnt, err, epoch, NL, pid, P, NS, KS,
                   IN_ROW, LROWS, RING, WAIT, MAX_SPIN, 0, ATTN_NS)),
        (_worker, (descs, x_desc, ring, ready, empty, xbuf, x_ready, x_empty, cnt, err, epoch, NL, pid, P, NS, KS,
                   IN_ROW, LROWS, RING, WAIT, MAX_SPIN, 1, ATTN_NS)),
    ], [1, 1], [WORKER_REGS, WORKER_REGS])


def chain_constants(shape):
    """The kernel's constexprs for `shape` (persistent_gemv's FULL or a smaller one), no split K."""
    lay = layout(shape, [UNIT_ROWS] * 4, [1] * 4)
    for offset in [lay["LSTRIDE"], lay["D0"]] + [in_off(lay, m) for m in range(4)]:
        assert offset % COPY_WIDTH == 0, "the inputs must start on whole rows of the copies"
    assert all(k % (COPY_WIDTH * COPY_ROWS) == 0 for k in shape["K"]) and CHUNK == COPY_WIDTH
    return lay, dict(NS=tuple(shape["N"]), KS=tuple(shape["K"]),
                     IN_ROW=tuple(in_off(lay, m) // COPY_WIDTH for m in range(4)), OUT_OFF=tuple(lay["O"]),
                     LSTRIDE=lay["LSTRIDE"], XROWS=max(shape["K"]) // COPY_WIDTH)


def compile_only(ring, warps):
    _, const = chain_constants(FULL)
    sig = {"W0": "*bf16", "W1": "*bf16", "W2": "*bf16", "W3": "*bf16", "act": "*bf16", "cnt": "*i32",
           "err": "*i32", "epoch": "i32", "NL": "i32", "act_rows": "i32"}
    const.update(RING=ring, WAIT=True, SIGNAL=True, MAX_SPIN=MAX_SPIN, WORKER_REGS=40, ATTN_NS=10000,
                 num_warps=warps, maxnreg=regs_per_thread(2, warps))
    compile_sm90(ws_chain, sig, const, f"ring {ring}")


def run_gpu(rings, reps, warps, programs, attention_us=(0, )):
    dev = "cuda"
    props = torch.cuda.get_device_properties(0)
    use_global_scratch(dev)
    bw = read_bandwidth_tbs(dev)
    shape = FULL
    lay, const = chain_constants(shape)
    problem = Problem(shape, dev)  # persistent_gemv's weights (same seed)
    weights = problem.W
    floor_ms = problem.bytes / bw / 1e9
    print(f"device {props.name}: read bandwidth {bw:.3f} TB/s, weights {problem.bytes / 1e9:.2f} GB, "
          f"roofline {floor_ms:.3f} ms", flush=True)
    act = torch.zeros(lay["total"], dtype=torch.bfloat16, device=dev)
    act[: shape["K"][0]] = torch.randn(shape["K"][0], device=dev).to(torch.bfloat16)
    cnt = torch.zeros(4 * shape["NL"], dtype=torch.int32, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    grid = programs or 2 * props.multi_processor_count
    maxnreg = regs_per_thread(-(-grid // props.multi_processor_count), warps)
    epoch = [0]

    def check():
        worst = 0.0
        for L in range(shape["NL"]):
            base = L * lay["LSTRIDE"]
            for m in range(4):
                n, k = shape["N"][m], shape["K"][m]
                x = act[base + in_off(lay, m): base + in_off(lay, m) + k].float()
                y = act[base + lay["O"][m]: base + lay["O"][m] + n].float()
                ref = weights[m][L * n:(L + 1) * n].float() @ x
                worst = max(worst, ((y - ref).norm() / ref.norm()).item())
        return worst

    for ring in rings:
        for wait, attn_us in [(True, us) for us in attention_us] + [(False, 0)]:
            cnt.zero_()  # counters and epochs start again: a NOWAIT variant signals nothing
            epoch[0] = 0
            options = dict(RING=ring, WAIT=wait, SIGNAL=wait, MAX_SPIN=MAX_SPIN, WORKER_REGS=40, num_warps=warps,
                           maxnreg=maxnreg, ATTN_NS=int(attn_us * 1000), **const)

            def launch():
                epoch[0] += 1
                ws_chain[(grid,)](*weights, act, cnt, err, epoch[0], shape["NL"], lay["total"] // COPY_WIDTH,
                                  **options)
            err.zero_()
            launch()
            torch.cuda.synchronize()
            name = (f"ws {grid} programs {warps} warps ring {ring:2d} {'waits ' if wait else 'NOWAIT'}"
                    f"{f' attention {attn_us:g} us' if attn_us else ''}")
            if err.item():  # a wait gave up: the grid was not co-resident, or the kernel is wrong
                print(f"{name}: a wait gave up after {MAX_SPIN} polls, not timed")
                continue
            kernel = ws_chain.warmup(*weights, act, cnt, err, 1, shape["NL"], lay["total"] // COPY_WIDTH,
                                     grid=(grid,), **options)
            kernel._init_handles()
            if wait:  # every output poisoned, then one checked launch
                act[shape["K"][0]:] = float("nan")
                launch()
                torch.cuda.synchronize()
                error = check()
            else:
                error = float("nan")
            ms, spread = bench(launch, reps)
            print(f"RESULT {name} {ms:7.3f} ms {100 * floor_ms / ms:5.1f}% of BW  rel_err {error:.1e}  "
                  f"err flag {int(err.item())}  regs {kernel.n_regs} spills {kernel.n_spills} "
                  f"shared {kernel.metadata.shared}  spread {spread[0]:.3f}-{spread[-1]:.3f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rings", default="8,12", help="ring depths to try, comma-separated")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warps", type=int, default=4, help="warps of the default (multiplying) partition")
    parser.add_argument("--programs", type=int, default=0, help="the grid (0: two programs an SM)")
    parser.add_argument("--attention-us", default="0", help="a layer's attention between QKV and o_proj, as a wait "
                        "of that many us before o_proj's input is loaded (comma-separated: one run each)")
    args = parser.parse_args()
    rings = [int(r) for r in args.rings.split(",")]
    if args.compile_only:
        for ring in rings:
            compile_only(ring, args.warps)
    else:
        run_gpu(rings, args.reps, args.warps, args.programs, [float(u) for u in args.attention_us.split(",")])


if __name__ == "__main__":
    main()
