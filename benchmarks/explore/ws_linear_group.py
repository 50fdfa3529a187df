"""The first megakernel body in Gluon: a projection's prefill group, from its own descriptor, with its epilogue.

`ws_prefill.py` showed a warp-specialized program an SM running the prefill tiles at cuBLAS's speed; this is the
same tile loop reading what the megakernel's LINEAR tasks read (codegen/bodies/linear.py): the descriptor's words
(`LINEAR_FIELDS`: the input's and the output's offsets and strides in ACT, the placed weight's in W, the norm's sums,
the residual, the bias, the output's sums of squares), the arenas, and the step's rows. Its epilogue is the
megakernel's `kept_epilogue` and `store_outputs`: the rows' 1/rms from their producer's sums of squares (the norm's
weight is folded into the placed weight), the bias, a rounding to bf16, gate/up's silu(gate) * up rounded as the
megakernel rounds it, the residual added and rounded again, the store, and the stored rows' sums of squares added
into F32 for the norm that reads them (fp64 sums with `NORM_SUMS_F64`, as `CompileConfig.exact_norm_sums`).

The epilogue runs either through pointers in the products' register layout, as the Triton body's does, or through
shared memory (`TMA_EPILOGUE`): the residual's tile loaded by TMA into the staging buffer when the tile starts, added
there, the outputs stored by one TMA copy; every run times both. It is the port's first step
(benchmarks/explore/NOTES.md, session 59): launched for a whole group, it can stand in for the Triton `_group` kernel
of the host-driven executor. Here it runs on synthetic arenas laid out as the
lowering lays them, for each of Llama-3-8B's projection kinds at a prompt's length (QKV's own body adds rotary and
the cache's writes, so it is left out), and is checked against the same epilogue written in torch.

    python -m benchmarks.explore.ws_linear_group --tokens 2048        # on an H100 / H200
    python -m benchmarks.explore.ws_linear_group --compile-only       # here, no GPU: compile for sm_90
"""
import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.explore.gluon_probe import compile_sm90, graph_ms, probe_header
from benchmarks.explore.ws_prefill import _tile
from codegen.bodies.linear import LINEAR_FIELDS
from codegen.tasks import DESC_WORDS, float_word

# the descriptor words this body reads, in this order (their indices into LINEAR_FIELDS are the kernel's WORDS)
USED = ("x_off", "x_stride", "k", "w_off", "n", "out_off", "out_stride", "stats_off", "eps", "res_off", "res_stride",
        "bias_off", "out_stats_off")
WORDS = gl.constexpr(tuple(LINEAR_FIELDS.index(f) for f in USED))
BM, BN, BK = (gl.constexpr(v) for v in (128, 256, 64))


@gluon.jit
def _loader(x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, pid, P, STAGES: gl.constexpr,
            GROUP: gl.constexpr):
    i = 0
    for t in range(pid, num_m * num_n, P):
        m, n, ks = _tile(t, num_m, num_n, 1, GROUP)
        for k in range(0, K, BK):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), (BM + BN) * BK * 2)
            tma.async_copy_global_to_shared(x_desc, [m * BM, k], ready.index(s), a_ring.index(s))
            tma.async_copy_global_to_shared(w_desc, [n * BN, k], ready.index(s), b_ring.index(s))
            i += 1


@gluon.jit
def _round(x):
    """fp32 values rounded to bf16 and back, as storing them would (`round_to`)."""
    return x.to(gl.bfloat16).to(gl.float32)


@gluon.jit
def _activate(y, m0, n0, num_rows, N, K, W, F32, stats_off, eps, bias_off, GATED: gl.constexpr,
              NORM_F64: gl.constexpr):
    """`kept_epilogue`'s arithmetic on the fp32 products y [BM, BN] of rows m0 .. and weight rows n0 ..: 1/rms from
    the producer's sums, bias, rounding, gating. Returns the outputs (rounded, fp32), their rows and columns (in the
    outputs' slices) and the outputs' width."""
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, y.type.layout))
    cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, y.type.layout))
    if stats_off >= 0:
        if NORM_F64:
            sums = gl.load((F32 + stats_off).to(gl.pointer_type(gl.float64), bitcast=True) + rows,
                           mask=rows < num_rows, other=1.0).to(gl.float32)
        else:
            sums = gl.load(F32 + stats_off + rows, mask=rows < num_rows, other=1.0)
        y = y * gl.rsqrt(sums / K.to(gl.float32) + eps)[:, None]
    if bias_off >= 0:
        y = y + gl.load(W + bias_off + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
    y = _round(y)
    if GATED:  # columns alternate gate, up: output column j is silu(y[:, 2j]) * y[:, 2j + 1]
        gate, up = gl.split(gl.reshape(y, [BM, BN // 2, 2]))
        y = _round(_round(gate / (1.0 + gl.exp(-gate))) * up)
        rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, y.type.layout))
        cols = n0 // 2 + gl.arange(0, BN // 2, layout=gl.SliceLayout(0, y.type.layout))
        N = N // 2
    return y, rows, cols, N


@gluon.jit
def _add_sums(F32, out_stats_off, y, rows, mask, num_rows, NORM_F64: gl.constexpr):
    """The stored rows' sums of squares added into F32 for the norm that reads them (`add_norm_sums`)."""
    sq = gl.sum(gl.where(mask, y * y, 0.0), axis=1)
    if NORM_F64:
        gl.atomic_add((F32 + out_stats_off).to(gl.pointer_type(gl.float64), bitcast=True) + rows, sq.to(gl.float64),
                      mask=rows < num_rows)
    else:
        gl.atomic_add(F32 + out_stats_off + rows, sq, mask=rows < num_rows)


@gluon.jit
def _epilogue(y, m0, n0, num_rows, N, K, W, ACT, F32, out_off, out_stride, stats_off, eps, res_off, res_stride,
              bias_off, out_stats_off, GATED: gl.constexpr, NORM_F64: gl.constexpr):
    """`kept_epilogue` and `store_outputs` through pointers in the products' layout."""
    y, rows, cols, N = _activate(y, m0, n0, num_rows, N, K, W, F32, stats_off, eps, bias_off, GATED, NORM_F64)
    mask = (rows < num_rows)[:, None] & (cols < N)[None, :]
    if res_off >= 0:
        res = gl.load(ACT + res_off + rows[:, None].to(gl.int64) * res_stride + cols[None, :], mask=mask, other=0.0)
        y = _round(res.to(gl.float32) + y)
    gl.store(ACT + out_off + rows[:, None].to(gl.int64) * out_stride + cols[None, :], y.to(gl.bfloat16), mask=mask)
    if out_stats_off >= 0:
        _add_sums(F32, out_stats_off, y, rows, mask, num_rows, NORM_F64)


@gluon.jit
def _epilogue_tma(y, m0, n0, num_rows, N, K, W, F32, o_desc, c_smem, res_bar, phase, stats_off, eps, res_off,
                  bias_off, out_stats_off, GATED: gl.constexpr, NORM_F64: gl.constexpr):
    """The same through shared memory: the residual's tile, loaded by TMA into the staging buffer when the tile
    began (`res_bar`), read there and added; the outputs written over it and stored by one TMA copy."""
    y, rows, cols, N = _activate(y, m0, n0, num_rows, N, K, W, F32, stats_off, eps, bias_off, GATED, NORM_F64)
    if res_off >= 0:
        mbarrier.wait(res_bar.index(0), phase)
        y = _round(c_smem.load(y.type.layout).to(gl.float32) + y)
        gl.thread_barrier()  # every warp's read of the residual before any writes over it
    c_smem.store(y.to(gl.bfloat16))
    fence_async_shared()
    if GATED:
        tma.async_copy_shared_to_global(o_desc, [m0, n0 // 2], c_smem)
    else:
        tma.async_copy_shared_to_global(o_desc, [m0, n0], c_smem)
    if out_stats_off >= 0:  # (rows and columns past the ends are zeros: their products' inputs were)
        _add_sums(F32, out_stats_off, y, rows, (rows < num_rows)[:, None] & (cols < N)[None, :], num_rows, NORM_F64)


@gluon.jit
def _consumer(W, ACT, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar, num_m, num_n, num_rows, N,
              K, out_off, out_stride, stats_off, eps, res_off, res_stride, bias_off, out_stats_off, pid, P,
              STAGES: gl.constexpr, GROUP: gl.constexpr, GATED: gl.constexpr, NORM_F64: gl.constexpr,
              TMA_EPILOGUE: gl.constexpr):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, BN, 16])
    OUT: gl.constexpr = BN // 2 if GATED else BN
    i = 0
    phase = 0
    for t in range(pid, num_m * num_n, P):
        m, n, ks = _tile(t, num_m, num_n, 1, GROUP)
        if TMA_EPILOGUE:
            tma.store_wait(pendings=0)  # the tile before has left the staging buffer
            if res_off >= 0:  # this tile's residual on its way while the products run
                mbarrier.expect(res_bar.index(0), BM * OUT * 2)
                tma.async_copy_global_to_shared(r_desc, [m * BM, n * OUT], res_bar.index(0), c_smem)
        acc = gl.zeros([BM, BN], gl.float32, acc_layout)
        for k in range(0, K, BK):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(s), b_ring.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1, pred=k > 0)
            i += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), count=1)
        if TMA_EPILOGUE:
            _epilogue_tma(acc, m * BM, n * BN, num_rows, N, K, W, F32, o_desc, c_smem, res_bar, phase, stats_off, eps,
                          res_off, bias_off, out_stats_off, GATED, NORM_F64)
            if res_off >= 0:
                phase ^= 1
        else:
            _epilogue(acc, m * BM, n * BN, num_rows, N, K, W, ACT, F32, out_off, out_stride, stats_off, eps, res_off,
                      res_stride, bias_off, out_stats_off, GATED, NORM_F64)
    if TMA_EPILOGUE:
        tma.store_wait(pendings=0)


@gluon.jit
def ws_linear_group(DESCS, W, ACT, F32, desc_index, num_rows, STAGES: gl.constexpr, GROUP: gl.constexpr,
                    GATED: gl.constexpr, NORM_F64: gl.constexpr, DESC_WORDS: gl.constexpr,
                    LOADER_REGS: gl.constexpr, TMA_EPILOGUE: gl.constexpr):
    """A LINEAR group's prefill: its projection of num_rows rows, every [BM, BN] tile, as its descriptor (row
    desc_index of DESCS) says. GATED: the descriptor's `gated` word (the output's width depends on it).
    TMA_EPILOGUE: the residual and the store through a staging buffer and TMA, else through pointers."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    desc = DESCS + desc_index * DESC_WORDS
    x_off, x_stride, w_off = gl.load(desc + WORDS[0]), gl.load(desc + WORDS[1]), gl.load(desc + WORDS[3])
    K = gl.load(desc + WORDS[2]).to(gl.int32)  # (a copy's coordinates are 32-bit)
    N, out_off, out_stride = gl.load(desc + WORDS[4]).to(gl.int32), gl.load(desc + WORDS[5]), \
        gl.load(desc + WORDS[6])
    stats_off = gl.load(desc + WORDS[7])
    eps = gl.load(desc + WORDS[8]).to(gl.float64, bitcast=True).to(gl.float32)
    res_off, res_stride, bias_off = gl.load(desc + WORDS[9]), gl.load(desc + WORDS[10]), gl.load(desc + WORDS[11])
    out_stats_off = gl.load(desc + WORDS[12])
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    x_desc = tma.make_tensor_descriptor(ACT + x_off, [num_rows, K], [x_stride, 1], [BM, BK], a_layout)
    w_desc = tma.make_tensor_descriptor(W + w_off, [N, K], [K.to(gl.int64), 1], [BN, BK], b_layout)
    OUT: gl.constexpr = BN // 2 if GATED else BN
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, OUT], gl.bfloat16)
    n_out = N // 2 if GATED else N
    o_desc = tma.make_tensor_descriptor(ACT + out_off, [num_rows, n_out], [out_stride, 1], [BM, OUT], c_layout)
    r_desc = tma.make_tensor_descriptor(ACT + gl.maximum(res_off, 0), [num_rows, n_out], [res_stride, 1], [BM, OUT],
                                        c_layout)
    c_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, OUT], c_layout)
    res_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(res_bar.index(0), count=1)
    a_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], a_layout)
    b_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], b_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    num_m = gl.cdiv(num_rows, BM)
    num_n = gl.cdiv(N, BN)
    gl.warp_specialize([
        (_consumer, (W, ACT, F32, a_ring, b_ring, ready, empty, o_desc, r_desc, c_smem, res_bar, num_m, num_n,
                     num_rows, N, K, out_off, out_stride, stats_off, eps, res_off, res_stride, bias_off,
                     out_stats_off, pid, P, STAGES, GROUP, GATED, NORM_F64, TMA_EPILOGUE)),
        (_loader, (x_desc, w_desc, a_ring, b_ring, ready, empty, num_m, num_n, K, pid, P, STAGES, GROUP)),
    ], [1], [LOADER_REGS])


def options(stages, gated, norm_f64, tma_epilogue, warps=8, group=8):
    return dict(STAGES=stages, GROUP=group, GATED=gated, NORM_F64=norm_f64, DESC_WORDS=DESC_WORDS, LOADER_REGS=40,
                TMA_EPILOGUE=tma_epilogue, num_warps=warps, maxnreg=65536 // ((warps + 4) * 32) // 8 * 8)


# Llama-3-8B's projections as the lowering lays them out: (name, N, K, gated, the input normed, a residual added,
# the output's sums of squares kept for the norm that reads it)
PROJECTIONS = (("o_proj", 4096, 4096, False, False, True, True), ("gate_up", 28672, 4096, True, True, False, False),
               ("down", 4096, 14336, False, False, True, True), ("lm_head_like", 4096, 4096, False, True, False, False))


def reference(x, w, bias, sums, res, eps, gated, norm_f64):
    """The megakernel's epilogue in torch: (the output, its rows' sums of squares or None)."""
    y = x.float() @ w.float().T
    if sums is not None:
        y = y * torch.rsqrt(sums.float() / x.shape[1] + eps)[:, None]
    if bias is not None:
        y = y + bias.float()
    y = y.bfloat16().float()
    if gated:
        gate, up = y[:, 0::2], y[:, 1::2]
        y = ((gate / (1.0 + torch.exp(-gate))).bfloat16().float() * up).bfloat16().float()
    if res is not None:
        y = (res.float() + y).bfloat16().float()
    return y, (y * y).sum(1).to(torch.float64 if norm_f64 else torch.float32) if res is not None else None


def run_gpu(tokens, stages, norm_f64, reps):
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe_header(f"one program an SM, 8 consumer warps + a loader warp; {tokens} tokens")
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, n, k, gated, normed, residual, out_stats in PROJECTIONS:
        n_out = n // 2 if gated else n
        # the arenas, laid out as the lowering lays them out: rows of every activation a whole row apart, offsets
        # multiples of 8 elements; the norm's sums (fp32, or fp64 as two words a row) in F32
        x_off, res_off, out_off = 8, 8 + tokens * k + 64, 8 + tokens * k + 64 + tokens * n_out + 64
        act = torch.zeros(out_off + tokens * n_out + 8, device=dev, dtype=torch.bfloat16)
        w_off, bias_off = 16, 16 + n * k + 64
        warena = torch.zeros(bias_off + n + 8, device=dev, dtype=torch.bfloat16)
        f32 = torch.zeros(8 + 4 * tokens + 8, device=dev, dtype=torch.float32)
        stats_off, out_stats_off = 8, 8 + 2 * tokens
        x = torch.randn(tokens, k, device=dev, generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device=dev, generator=gen) / k ** 0.5).to(torch.bfloat16)
        act[x_off:x_off + tokens * k] = x.flatten()
        warena[w_off:w_off + n * k] = w.flatten()
        sums = res = None
        if normed:
            sums = (x.float() ** 2).sum(1) * torch.rand(tokens, device=dev, generator=gen).add(0.5)
            view = f32.view(torch.float64) if norm_f64 else f32
            base = stats_off // 2 if norm_f64 else stats_off
            view[base:base + tokens] = sums.to(view.dtype)
        if residual:
            res = torch.randn(tokens, n_out, device=dev, generator=gen).to(torch.bfloat16)
            act[res_off:res_off + tokens * n_out] = res.flatten()
        values = dict.fromkeys(LINEAR_FIELDS, 0)
        values.update(x_off=x_off, x_stride=k, k=k, w_off=w_off, n=n, out_off=out_off, out_stride=n_out,
                      stats_off=stats_off if normed else -1, eps=float_word(1e-5),
                      res_off=res_off if residual else -1, res_stride=n_out, bias_off=-1,
                      out_stats_off=out_stats_off if out_stats else -1, gated=int(gated))
        descs = torch.tensor([[values[f] for f in LINEAR_FIELDS] + [0] * (DESC_WORDS - len(LINEAR_FIELDS))],
                             dtype=torch.int64, device=dev)
        for tma_epilogue in (False, True):
            opts = options(stages, gated, norm_f64, tma_epilogue)

            def launch():
                f32[out_stats_off:out_stats_off + 2 * tokens] = 0
                ws_linear_group[(sms, )](descs, warena, act, f32, 0, tokens, **opts)
            act[out_off:out_off + tokens * n_out] = float("nan")
            launch()
            torch.cuda.synchronize()
            want, want_sq = reference(x, w, None, sums, res, 1e-5, gated, norm_f64)
            got = act[out_off:out_off + tokens * n_out].view(tokens, n_out).float()
            err = ((got - want).norm() / want.norm()).item()
            line = f"rel_err {err:.1e}, {(got != want).float().mean().item():.1%} of outputs off by a rounding"
            if out_stats:
                view = f32.view(torch.float64) if norm_f64 else f32
                base = out_stats_off // 2 if norm_f64 else out_stats_off
                got_sq = view[base:base + tokens].double()
                sq_err = ((got_sq - want_sq.double()).norm() / want_sq.double().norm()).item()
                line += f", sums of squares rel_err {sq_err:.1e}"
            ms = graph_ms(launch, reps)
            cublas_ms = graph_ms(lambda: torch.matmul(x, w.T), reps)
            how = "TMA" if tma_epilogue else "pointers"
            print(f"RESULT {name:12s} [{tokens}, {k}] x [{n}, {k}]^T, epilogue through {how:8s}: {ms * 1e3:7.1f} us, "
                  f"cuBLAS's product alone {cublas_ms * 1e3:7.1f} us ({cublas_ms / ms:.2f}x); {line}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--f64-sums", action="store_true", help="the norms' sums in fp64 (exact_norm_sums)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.compile_only:
        sig = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "desc_index": "i32", "num_rows": "i32"}
        for gated in (False, True):
            for tma_epilogue in (False, True):
                compile_sm90(ws_linear_group, sig, options(args.stages, gated, args.f64_sums, tma_epilogue),
                             f"ws_linear_group_{args.stages}_{int(gated)}_{int(tma_epilogue)}",
                             f"{args.stages} stages, gated={gated}, TMA epilogue={tma_epilogue}")
    else:
        run_gpu(args.tokens, args.stages, args.f64_sums, args.reps)


if __name__ == "__main__":
    main()
