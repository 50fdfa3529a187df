"""Do three prefill groups run faster as one persistent Gluon kernel, each tile waiting only for its own rows? (Gluon)

The host-driven executor launches each projection group as a kernel of its own (`codegen/gluon/linear.py`), so a
group starts only when the one before has finished its last tile: at 2,048 tokens o_proj's 256 [128, 256] tiles are
1.94 rounds of 132 SMs and down's the same, so part of the GPU idles at every group's end. The persistent megakernel
the port is for runs them as one kernel with event counters (a task waits until its inputs are written). This probe
runs a layer's o_proj -> gate/up -> down that way: one program an SM walks the three groups' tiles in order (every
P-th), the loader warp waits before a tile's first copy until the tile's input rows are written (a counter a group
and row block, which each tile of that row block adds one to once its outputs are stored), and the consumers wait for
the same counter before reading the tile's residual and norm sums. A tile of down can then start as soon as its 128
rows of gate/up are done, while the rest of gate/up still runs.

The tiles, their loads and their epilogues are `codegen.gluon`'s ([128, 256] tiles, `load_tile`'s copies, the
LINEAR epilogue); the arenas are synthetic, laid out as the lowering lays them (as `ws_linear_group.py`). Checked
against the three group kernels launched back to back on the same arenas (the outputs should match bit for bit: the
same tiles and order), both timed from CUDA graphs.

    python -m benchmarks.explore.ws_chain --tokens 2048,512      # on an H100 / H200
    python -m benchmarks.explore.ws_chain --compile-only         # here, no GPU: compile for sm_90
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from benchmarks.explore.gluon_probe import compile_sm90, launches_against, probe_header
from codegen.bodies.linear import LINEAR_FIELDS
from codegen.gluon import linear
from codegen.gluon.linear import BK, BM, WORDS, _epilogue
from codegen.gluon.tiles import load_tile, ring, tile_at, tile_product
from codegen.tasks import DESC_WORDS, float_word

BN = gl.constexpr(256)
GROUP = gl.constexpr(8)
WORDS_A_ROW = gl.constexpr(DESC_WORDS)


@gluon.jit
def _wait(EVENTS, index, target):
    """Spins until EVENTS[index] reaches target (acquire: what its signals released is visible after)."""
    seen = gl.atomic_add(EVENTS + index, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = gl.atomic_add(EVENTS + index, 0, sem="acquire", scope="gpu")


@gluon.jit
def _stores_done(x):
    """This thread's bulk tensor stores written to global memory, ordered before its later generic accesses."""
    return gl.inline_asm_elementwise("cp.async.bulk.wait_group 0; fence.proxy.async.global; mov.u32 $0, $1;",
                                     "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _which(t, T0, T1, num_m, n0, n1, n2):
    """Global tile t's (group, row block, column block): the groups' tiles one after another, each in the grouped
    order."""
    g = (t >= T0).to(gl.int32) + (t >= T0 + T1).to(gl.int32)
    local = t - gl.where(g == 0, 0, gl.where(g == 1, T0, T0 + T1))
    num_n = gl.where(g == 0, n0, gl.where(g == 1, n1, n2))
    m, n = tile_at(local, num_m, num_n, GROUP)
    return g, m, n


@gluon.jit
def _loader(x0, w0, x1, w1, x2, w2, EVENTS, a_ring, b_ring, ready, empty, num_m, n0, n1, n2, K0, K1, K2,
            STAGES: gl.constexpr):
    T0, T1 = num_m * n0, num_m * n1
    i = 0
    for t in range(gl.program_id(0), T0 + T1 + num_m * n2, gl.num_programs(0)):
        g, m, n = _which(t, T0, T1, num_m, n0, n1, n2)
        if g == 0:
            i = load_tile(x0, w0, a_ring, b_ring, ready, empty, i, m, n, K0, STAGES)
        elif g == 1:  # its input rows: o_proj's row block m, every column of it
            _wait(EVENTS, m, n0)
            i = load_tile(x1, w1, a_ring, b_ring, ready, empty, i, m, n, K1, STAGES)
        else:  # gate/up's
            _wait(EVENTS, num_m + m, n1)
            i = load_tile(x2, w2, a_ring, b_ring, ready, empty, i, m, n, K2, STAGES)


@gluon.jit
def _consumer(DESCS, W, F32, EVENTS, a_ring, b_ring, ready, empty, o0, o1, o2, r0, r2, c_smem, res_bar, num_rows,
              num_m, n0, n1, n2, STAGES: gl.constexpr, NORM_F64: gl.constexpr):
    T0, T1 = num_m * n0, num_m * n1
    c_gated = c_smem._reinterpret(gl.bfloat16, [BM, BN // 2],
                                  gl.NVMMASharedLayout.get_default_for([BM, BN // 2], gl.bfloat16))
    i = 0
    phase = 0
    for t in range(gl.program_id(0), T0 + T1 + num_m * n2, gl.num_programs(0)):
        g, m, n = _which(t, T0, T1, num_m, n0, n1, n2)
        desc = DESCS + g * WORDS_A_ROW
        K, N = gl.load(desc + WORDS[2]).to(gl.int32), gl.load(desc + WORDS[4]).to(gl.int32)
        stats_off, eps = gl.load(desc + WORDS[7]), gl.load(desc + WORDS[8]).to(gl.float64, bitcast=True).to(gl.float32)
        res_off, bias_off, out_stats_off = gl.load(desc + WORDS[9]), gl.load(desc + WORDS[11]), gl.load(desc + WORDS[12])
        if g == 1:  # the rows' norm sums, from o_proj's row block
            _wait(EVENTS, m, n0)
        elif g == 2:  # (o_proj's residual, and gate/up's rows, are before this)
            _wait(EVENTS, num_m + m, n1)
        tma.store_wait(pendings=0)  # the tile before has left the staging buffer
        if g == 0:
            mbarrier.expect(res_bar.index(0), BM * BN * 2)
            tma.async_copy_global_to_shared(r0, [m * BM, n * BN], res_bar.index(0), c_smem)
        elif g == 2:
            mbarrier.expect(res_bar.index(0), BM * BN * 2)
            tma.async_copy_global_to_shared(r2, [m * BM, n * BN], res_bar.index(0), c_smem)
        acc, i = tile_product(a_ring, b_ring, ready, empty, i, K, STAGES)
        if g == 0:
            _epilogue(acc, m * BM, n * BN, num_rows, N, K, W, F32, o0, c_smem, res_bar, phase, stats_off, eps, res_off,
                      bias_off, out_stats_off, False, NORM_F64)
            phase ^= 1
        elif g == 1:
            _epilogue(acc, m * BM, n * BN, num_rows, N, K, W, F32, o1, c_gated, res_bar, phase, stats_off, eps,
                      res_off, bias_off, out_stats_off, True, NORM_F64)
        else:
            _epilogue(acc, m * BM, n * BN, num_rows, N, K, W, F32, o2, c_smem, res_bar, phase, stats_off, eps, res_off,
                      bias_off, out_stats_off, False, NORM_F64)
            phase ^= 1
        # the tile's outputs and sums written, then its row block's counter moves on
        _stores_done(t)
        gl.thread_barrier()
        gl.atomic_add(EVENTS + g * num_m + m, 1, sem="release", scope="gpu")


@gluon.jit
def chain(DESCS, W, ACT, F32, I32, EVENTS, STAGES: gl.constexpr, NORM_F64: gl.constexpr, LOADER_REGS: gl.constexpr):
    """Descriptor rows 0, 1, 2 of DESCS (o_proj, gate/up, down: LINEAR_FIELDS) over I32[0] rows; EVENTS: 3 counters a
    row block, zero at the launch."""
    num_rows = gl.load(I32)
    num_m = gl.cdiv(num_rows, BM)
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], gl.bfloat16)
    wide: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN], gl.bfloat16)
    gated: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BN // 2], gl.bfloat16)
    d0, d1, d2 = DESCS, DESCS + WORDS_A_ROW, DESCS + 2 * WORDS_A_ROW
    K0, K1, K2 = gl.load(d0 + WORDS[2]).to(gl.int32), gl.load(d1 + WORDS[2]).to(gl.int32), \
        gl.load(d2 + WORDS[2]).to(gl.int32)
    N0, N1, N2 = gl.load(d0 + WORDS[4]).to(gl.int32), gl.load(d1 + WORDS[4]).to(gl.int32), \
        gl.load(d2 + WORDS[4]).to(gl.int32)
    x0 = tma.make_tensor_descriptor(ACT + gl.load(d0 + WORDS[0]), [num_rows, K0], [gl.load(d0 + WORDS[1]), 1], [BM, BK],
                                    a_layout)
    x1 = tma.make_tensor_descriptor(ACT + gl.load(d1 + WORDS[0]), [num_rows, K1], [gl.load(d1 + WORDS[1]), 1], [BM, BK],
                                    a_layout)
    x2 = tma.make_tensor_descriptor(ACT + gl.load(d2 + WORDS[0]), [num_rows, K2], [gl.load(d2 + WORDS[1]), 1], [BM, BK],
                                    a_layout)
    w0 = tma.make_tensor_descriptor(W + gl.load(d0 + WORDS[3]), [N0, K0], [K0.to(gl.int64), 1], [BN, BK], b_layout)
    w1 = tma.make_tensor_descriptor(W + gl.load(d1 + WORDS[3]), [N1, K1], [K1.to(gl.int64), 1], [BN, BK], b_layout)
    w2 = tma.make_tensor_descriptor(W + gl.load(d2 + WORDS[3]), [N2, K2], [K2.to(gl.int64), 1], [BN, BK], b_layout)
    o0 = tma.make_tensor_descriptor(ACT + gl.load(d0 + WORDS[5]), [num_rows, N0], [gl.load(d0 + WORDS[6]), 1], [BM, BN],
                                    wide)
    o1 = tma.make_tensor_descriptor(ACT + gl.load(d1 + WORDS[5]), [num_rows, N1 // 2], [gl.load(d1 + WORDS[6]), 1],
                                    [BM, BN // 2], gated)
    o2 = tma.make_tensor_descriptor(ACT + gl.load(d2 + WORDS[5]), [num_rows, N2], [gl.load(d2 + WORDS[6]), 1], [BM, BN],
                                    wide)
    r0 = tma.make_tensor_descriptor(ACT + gl.load(d0 + WORDS[9]), [num_rows, N0], [gl.load(d0 + WORDS[10]), 1],
                                    [BM, BN], wide)
    r2 = tma.make_tensor_descriptor(ACT + gl.load(d2 + WORDS[9]), [num_rows, N2], [gl.load(d2 + WORDS[10]), 1],
                                    [BM, BN], wide)
    c_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], wide)
    res_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(res_bar.index(0), count=1)
    a_ring, b_ring, ready, empty = ring(BM, BN, BK, STAGES)
    n0, n1, n2 = gl.cdiv(N0, BN), gl.cdiv(N1, BN), gl.cdiv(N2, BN)
    gl.warp_specialize([
        (_consumer, (DESCS, W, F32, EVENTS, a_ring, b_ring, ready, empty, o0, o1, o2, r0, r2, c_smem, res_bar,
                     num_rows, num_m, n0, n1, n2, STAGES, NORM_F64)),
        (_loader, (x0, w0, x1, w1, x2, w2, EVENTS, a_ring, b_ring, ready, empty, num_m, n0, n1, n2, K0, K1, K2,
                   STAGES)),
    ], [1], [LOADER_REGS])


OPTIONS = dict(STAGES=3, NORM_F64=True, LOADER_REGS=linear.LOADER_REGS, **linear.LAUNCH)
SIGNATURE = {"DESCS": "*i64", "W": "*bf16", "ACT": "*bf16", "F32": "*fp32", "I32": "*i32", "EVENTS": "*i32"}


def arenas(tokens: int, dev: str):
    """Llama-3-8B's o_proj -> gate/up -> down on arenas laid out as the lowering lays them: (descs, W, ACT, F32, the
    outputs' views)."""
    hidden, inter = 4096, 14336
    gen = torch.Generator(device=dev).manual_seed(tokens)
    layout, at = {}, 8
    for name, width in (("attn", hidden), ("h", hidden), ("h_mid", hidden), ("act", inter), ("h_out", hidden)):
        layout[name], at = at, at + tokens * width + 64
    act = torch.randn(at, device=dev, generator=gen).to(torch.bfloat16)
    w_at, weights = 16, {}
    for name, (n, k) in (("o", (hidden, hidden)), ("gu", (2 * inter, hidden)), ("d", (hidden, inter))):
        weights[name], w_at = w_at, w_at + n * k + 64
    warena = (torch.randn(w_at, device=dev, generator=gen) / 64).to(torch.bfloat16)
    f32 = torch.zeros(8 + 4 * tokens + 8, device=dev)  # o_proj's out sums (fp64, read by gate/up), down's
    sums_mid, sums_out = 8, 8 + 2 * tokens
    values = []
    for x, k, w, n, out, out_stride, stats, res, out_stats, gated in (
            ("attn", hidden, "o", hidden, "h_mid", hidden, -1, "h", sums_mid, 0),
            ("h_mid", hidden, "gu", 2 * inter, "act", inter, sums_mid, None, -1, 1),
            ("act", inter, "d", hidden, "h_out", hidden, -1, "h_mid", sums_out, 0)):
        v = dict.fromkeys(LINEAR_FIELDS, 0)
        v.update(x_off=layout[x], x_stride=k, k=k, w_off=weights[w], n=n, out_off=layout[out], out_stride=out_stride,
                 stats_off=stats, eps=float_word(1e-5), res_off=layout[res] if res else -1, res_stride=hidden,
                 bias_off=-1, out_stats_off=out_stats, gated=gated, route_ticket=-1)
        values.append([v[f] for f in LINEAR_FIELDS] + [0] * (DESC_WORDS - len(LINEAR_FIELDS)))
    descs = torch.tensor(values, dtype=torch.int64, device=dev)
    outputs = {name: act[layout[name]:layout[name] + tokens * width] for name, width in
               (("h_mid", hidden), ("act", inter), ("h_out", hidden))}
    return descs, warena, act, f32, outputs


def run_gpu(token_counts, reps):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe_header("o_proj -> gate/up -> down: one persistent kernel against three group kernels")
    for tokens in token_counts:
        descs, warena, act, f32, outputs = arenas(tokens, "cuda")
        i32 = torch.tensor([tokens], dtype=torch.int32, device="cuda")
        num_m = -(-tokens // 128)
        events = torch.zeros(3 * num_m, dtype=torch.int32, device="cuda")

        def groups():
            f32.zero_()
            for g, gated in enumerate((False, True, False)):
                linear.linear_prefill[(sms, )](descs, warena, act, f32, i32, g, 0, 0, 0,
                                               **linear.WIDE.constexprs(gated, True), **linear.LAUNCH)

        def persistent():
            f32.zero_()
            events.zero_()
            chain[(sms, )](descs, warena, act, f32, i32, events, **OPTIONS)
        groups_ms, chain_ms, errs = launches_against(groups, persistent, act, outputs, reps)
        print(f"RESULT {tokens} tokens: three group kernels {groups_ms * 1e3:7.1f} us, one persistent kernel "
              f"{chain_ms * 1e3:7.1f} us ({groups_ms / chain_ms:.2f}x); outputs' largest difference "
              f"{', '.join(f'{k} {v:.1e}' for k, v in errs.items())}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--tokens", default="2048,512")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if args.compile_only:
        compile_sm90(chain, SIGNATURE, OPTIONS, "o_proj -> gate/up -> down, one persistent kernel")
    else:
        run_gpu([int(t) for t in args.tokens.split(",")], args.reps)


if __name__ == "__main__":
    main()
