"""The first megakernel body in Gluon, on synthetic arenas: a projection's prefill group from its own descriptor.

Session 59's probe of the LINEAR prefill body, which became `codegen/gluon/linear.py` (session 60): the same kernel,
launched here on arenas laid out as the lowering lays them (rows of every activation a whole row apart, offsets
multiples of 8 elements, the norm's sums in F32) for each of Llama-3-8B's projection kinds at a prompt's length, and
checked against the megakernel's epilogue written in torch (1/rms from the producer's sums, rounding, gate/up's
silu(gate) * up, the residual, the stored rows' sums of squares in fp32 or fp64), next to cuBLAS's bare product. In the
model it is checked against the Triton body instead (`benchmarks/gluon_groups.py`). Session 59 also timed an
epilogue through pointers in the products' layout (o_proj 151.2, gate/up 814.2, down 408.3 us at 2,048 tokens against
113.9, 710.7, 363.1 through shared memory and TMA: RESULTS.md); the body kept the second.

    python -m benchmarks.explore.ws_linear_group --tokens 2048        # on an H100 / H200
    python -m codegen.gluon                                           # here, no GPU: compile for sm_90
"""
import argparse

import torch

from benchmarks.explore.gluon_probe import graph_ms, probe_header
from codegen.bodies.linear import LINEAR_FIELDS
from codegen.gluon import linear
from codegen.tasks import DESC_WORDS, float_word


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


def run_gpu(tokens, norm_f64, reps):
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe_header(f"codegen.gluon.linear: one program an SM, 8 consumer warps + a loader warp; {tokens} tokens")
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
        i32 = torch.tensor([tokens], dtype=torch.int32, device=dev)  # the step's tokens, as the plan's control word
        for tiles in (linear.WIDE, linear.NARROW):
            opts = {**tiles.constexprs(gated, norm_f64), **linear.LAUNCH}

            def launch():
                f32[out_stats_off:out_stats_off + 2 * tokens] = 0
                linear.linear_prefill[(sms, )](descs, warena, act, f32, i32, 0, 0, 0, 0, **opts)
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
            how = f"[128, {tiles.bn}] tiles"
            print(f"RESULT {name:12s} [{tokens}, {k}] x [{n}, {k}]^T, {how}: {ms * 1e3:7.1f} us, "
                  f"cuBLAS's product alone {cublas_ms * 1e3:7.1f} us ({cublas_ms / ms:.2f}x); {line}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--f64-sums", action="store_true", help="the norms' sums in fp64 (exact_norm_sums)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    run_gpu(args.tokens, args.f64_sums, args.reps)


if __name__ == "__main__":
    main()
