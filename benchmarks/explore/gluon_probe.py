"""What the Gluon probes (`ws_*.py`) share: a compile for sm_90 on a machine without a GPU, CUDA-graph timing, and the
projection harness (Llama-3-8B's four projections, checked and timed next to cuBLAS and torch's GEMV)."""
from __future__ import annotations

import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from codegen.gluon import compile_for_sm90

# Llama-3-8B: (name, output columns, K, gated); gate/up's columns alternate gate, up and its output is half as wide
SHAPES = (("qkv", 6144, 4096, False), ("o_proj", 4096, 4096, False), ("gate_up", 28672, 4096, True),
          ("down", 4096, 14336, False))


@gluon.jit
def gemv_load(g_desc, g_ring, ready, empty, base, i, first, step, N, K, SLOTS: gl.constexpr):
    """A loader's part of one row's GEMV: the weight chunks [GR, GK] of units first, first + step, ... (GR rows each)
    into slots base .. base + SLOTS of g_ring, the ring's count starting at i."""
    GR: gl.constexpr = g_ring.type.shape[1]
    GK: gl.constexpr = g_ring.type.shape[2]
    i = gl.to_tensor(i)  # (a count of 0 passed in is a constant; the loop needs a value)
    for u in range(first, N // GR, step):
        for k in range(0, K, GK):
            s = base + i % SLOTS
            mbarrier.wait(empty.index(s), ((i // SLOTS) & 1) ^ 1)  # (a barrier starts as if its phase 1 were done)
            mbarrier.expect(ready.index(s), GR * GK * 2)
            tma.async_copy_global_to_shared(g_desc, [u * GR, k], ready.index(s), g_ring.index(s))
            i += 1


@gluon.jit
def gemv_consume(xv, yv, g_ring, ready, empty, base, i, first, step, N, K, SLOTS: gl.constexpr):
    """The consumers' part: yv[u * GR ..] = w[u * GR .., :] @ xv for those units, each chunk multiplied on the CUDA
    cores as it arrives."""
    GR: gl.constexpr = g_ring.type.shape[1]
    GK: gl.constexpr = g_ring.type.shape[2]
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
    cols: gl.constexpr = gl.SliceLayout(0, blocked)
    rows: gl.constexpr = gl.SliceLayout(1, blocked)
    i = gl.to_tensor(i)  # (a count of 0 passed in is a constant; the loop needs a value)
    for u in range(first, N // GR, step):
        acc = gl.zeros([GR, GK], gl.float32, blocked)
        for k in range(0, K, GK):
            s = base + i % SLOTS
            xk = gl.load(xv + k + gl.arange(0, GK, layout=cols))
            mbarrier.wait(ready.index(s), (i // SLOTS) & 1)
            wk = g_ring.index(s).load(blocked)
            fence_async_shared()  # the slot's reads before the loader's next copy into it
            mbarrier.arrive(empty.index(s), count=1)
            acc += wk.to(gl.float32) * xk.to(gl.float32)[None, :]
            i += 1
        gl.store(yv + u * GR + gl.arange(0, GR, layout=rows), gl.sum(acc, axis=1).to(gl.bfloat16))


def compile_sm90(fn, signature: dict, opts: dict, label: str) -> None:
    """Compiles the Gluon kernel fn for sm_90 (no GPU needed, `codegen.gluon.compile_for_sm90`) and prints its
    registers, spills and shared memory. opts: its constexprs, with num_warps and maxnreg."""
    const = {k: v for k, v in opts.items() if k not in ("num_warps", "maxnreg")}
    print(f"{label}: {compile_for_sm90(fn, signature, const, opts['num_warps'], opts['maxnreg'])}", flush=True)


def graph_ms(fn, reps: int) -> float:
    """Median ms of one fn() from CUDA graphs of reps calls, five replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[2]


def launches_against(first, second, act: torch.Tensor, outputs: dict, reps: int) -> tuple[float, float, dict]:
    """first() and second(), each from the activations as they are now (act restored before each): their ms from CUDA
    graphs of reps calls (`graph_ms`) and, for each of `outputs` (views into act), the largest difference between
    what the two wrote."""
    start = act.clone()
    first()
    want = {name: out.clone() for name, out in outputs.items()}
    act.copy_(start)
    second()
    torch.cuda.synchronize()
    errs = {name: (outputs[name].float() - want[name].float()).abs().max().item() for name in outputs}
    act.copy_(start)
    first_ms = graph_ms(first, reps)
    act.copy_(start)
    second_ms = graph_ms(second, reps)
    return first_ms, second_ms, errs


def use_global_scratch(dev: str = "cuda") -> None:
    """In-kernel tensor descriptors need global scratch from Triton's allocator."""
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))


def probe_header(describe: str) -> float:
    """Sets up a GPU probe (the descriptors' scratch), prints the device and the read bandwidth measured now, and
    returns it (TB/s)."""
    from benchmarks.baselines import read_bandwidth_tbs
    use_global_scratch("cuda")
    bw = read_bandwidth_tbs("cuda")
    print(f"device {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).multi_processor_count} "
          f"SMs, read bandwidth {bw:.2f} TB/s; {describe}", flush=True)
    return bw


def projection_inputs(shapes, tokens: int):
    """For each projection of SHAPES (or only those named in shapes): (name, N, K, gated, x [tokens, K], w [N, K], a
    row xv [K], the fp32 product x @ w^T, what the projection outputs (gated: silu(gate) * up of it), w @ xv), the
    same random values in every probe."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, n, k, gated in SHAPES:
        if shapes and name not in shapes:
            continue
        x = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        xv = torch.randn(k, device="cuda", generator=gen).to(torch.bfloat16)
        product = x.float() @ w.float().T
        ref = torch.nn.functional.silu(product[:, 0::2]) * product[:, 1::2] if gated else product
        yield name, n, k, gated, x, w, xv, product, ref, w.float() @ xv.float()


def projection_probe(launcher, specs, tokens: int, reps: int, shapes, describe: str) -> None:
    """Each projection of SHAPES (or only those named in shapes) at `tokens` rows: cuBLAS and torch's one-row GEMV
    timed, then for every spec, launcher(spec, gated, run_prefill) -> a function of (x, w, y, xv, yv, M, N, K) that
    launches the probe on them (run_prefill 1: y = x @ w^T, gated as gate/up is; 0: yv = w @ xv), checked against
    fp32 and timed. Every time from CUDA graphs; every line of figures starts RESULT."""
    bw = probe_header(f"{describe}; {tokens} tokens")
    for name, n, k, gated, x, w, xv, product, ref, ref_v in projection_inputs(shapes, tokens):
        flop, weight_bytes = 2 * tokens * n * k, w.numel() * 2
        cublas_ms = graph_ms(lambda: torch.matmul(x, w.T), reps)
        gemv_ms = graph_ms(lambda: torch.matmul(w, xv), reps)
        print(f"{name:8s} [{tokens}, {k}] x [{n}, {k}]^T: cuBLAS {cublas_ms * 1e3:7.1f} us; one row's GEMV "
              f"{gemv_ms * 1e3:6.1f} us ({weight_bytes / gemv_ms / 1e9:4.2f} TB/s)", flush=True)
        y = torch.empty(tokens, n // 2 if gated else n, device="cuda", dtype=torch.bfloat16)
        yv = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        for spec in specs:
            for run_prefill in (1, 0):
                kernel = launcher(spec, gated, run_prefill)
                tag = f"{name:8s} {'/'.join(str(v) for v in spec)} {'prefill' if run_prefill else 'decode '}"

                def launch():
                    kernel(x, w, y, xv, yv, tokens, n, k)
                try:
                    y.fill_(float("nan"))
                    yv.fill_(float("nan"))
                    launch()
                    torch.cuda.synchronize()
                except Exception as exc:  # a variant that does not compile or launch: say so, go on
                    print(f"  {tag}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                    continue
                out, want = (y, ref) if run_prefill else (yv, ref_v)
                err = ((out.float() - want).norm() / want.norm()).item()
                ms = graph_ms(launch, reps)
                rate = (f"{flop / ms / 1e9:5.0f} TFLOP/s, {cublas_ms / ms:.2f}x cuBLAS" if run_prefill else
                        f"{weight_bytes / ms / 1e9:4.2f} TB/s, {weight_bytes / ms / 1e9 / bw:.0%} of BW")
                print(f"RESULT {tag}: {ms * 1e3:7.1f} us ({rate}) rel_err {err:.1e}", flush=True)


# the arguments of a projection probe's kernel: (x, w, y, xv, yv, M, N, K, run_prefill), then its constexprs
PROJECTION_SIGNATURE = {"x": "*bf16", "w": "*bf16", "y": "*bf16", "xv": "*bf16", "yv": "*bf16", "M": "i32", "N": "i32",
                        "K": "i32", "run_prefill": "i32"}


def projection_main(doc: str, kernel, options, parse, default_variants: str, variant_help: str, describe: str) -> None:
    """The command line of a projection probe: its kernel takes PROJECTION_SIGNATURE's arguments, one program an SM,
    and options(*spec, gated) its constexprs with num_warps and maxnreg; parse turns --variants into specs.
    --compile-only compiles every spec, gated and not, for sm_90 here; else `projection_probe` runs them."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--variants", default=default_variants, help=variant_help)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=20, help="launches a CUDA graph (timings: its replays)")
    parser.add_argument("--shapes", default="", help="only these projections (comma-separated names)")
    args = parser.parse_args()
    specs = parse(args.variants)
    if args.compile_only:
        for spec in specs:
            for gated in (False, True):
                compile_sm90(kernel, PROJECTION_SIGNATURE, options(*spec, gated),
                             f"{'/'.join(str(v) for v in spec)} gated={gated}")
        return

    def launcher(spec, gated, run_prefill):
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        opts = options(*spec, gated)
        return lambda x, w, y, xv, yv, m, n, k: kernel[(sms, )](x, w, y, xv, yv, m, n, k, run_prefill, **opts)
    projection_probe(launcher, specs, args.tokens, args.reps, [s for s in args.shapes.split(",") if s], describe)
