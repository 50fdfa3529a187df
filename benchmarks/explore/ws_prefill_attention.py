"""Does a prefill's causal attention reach SDPA's speed when a loader warp streams the paged keys? (Gluon)

The megakernel's prefill attention takes ~170 us a Llama-3-8B layer at 2,048 tokens (`profile_step --prefill`,
session 59) against SDPA's ~84 alone (`prefill_attention.py`, session 48): its loop waits on every warp's copies of
a block's keys (a barrier before the QK dot) and on the page ids and 64-bit addresses of a gather. Here, as in
`ws_decode_attention.py`, a loader warp reads the page ids IDS at a time and copies each page's keys and values as
TMA boxes (two column halves of 64, a 128-byte swizzle's width) into a ring of STAGES slots of BLOCK keys, running
ahead across items; the default partition (`--warps`: 4, or 8 for two warp groups) runs each item's query rows
(BM = 16 x warps: tokens x the four query heads of a KV group, as the megakernel's items) through the online softmax
on `wgmma`: scores = q k^T over the halves, the causal mask, the output halves += p v.

Items are the megakernel's: (a block of BM query rows, a KV head), handed out in its zigzag over a persistent grid,
one program an SM here. The keys of one sequence sit in a shuffled page table, as `prefill_attention.py` lays them.
Timed from CUDA graphs next to SDPA (causal, GQA, contiguous) and the megakernel's own `attend` on its 264
programs, in the same call; checked against SDPA.

    python -m benchmarks.explore.ws_prefill_attention --prompts 512,2048      # on an H100 / H200
    python -m benchmarks.explore.ws_prefill_attention --compile-only          # here, no GPU: compile for sm_90

A variant is BLOCK/STAGES/warps[/PIPE] (keys a slot, slots, consumer warps; PIPE 1: each block's scores asked of the
tensor cores before the block before's softmax, so that the two overlap, as flash attention 3 orders them).
"""
import argparse

import torch
import torch.nn.functional as F
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from benchmarks.explore.gluon_probe import compile_sm90, graph_ms, use_global_scratch

LOG2E = gl.constexpr(1.4426950408889634)  # scores in units of raw dot products: exp(x scale) = 2^(x scale LOG2E)


@gluon.jit
def _item(r, pid, P, total, HKV: gl.constexpr, BM: gl.constexpr, REP: gl.constexpr, T):
    """Round r's item of program pid (the megakernel's zigzag): (valid, KV head, first query row, keys to read)."""
    item = r * P + gl.where(r % 2 == 0, pid, P - 1 - pid)
    m0 = (item // HKV) * BM
    return item < total, item % HKV, m0, gl.minimum(T, (m0 + BM - 1) // REP + 1)


@gluon.jit
def _loader(pool, pages, k_ring, v_ring, ready, empty, T, num_slots, total, pid, P, HKV: gl.constexpr,
            HD: gl.constexpr, REP: gl.constexpr, BM: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr,
            STAGES: gl.constexpr, IDS: gl.constexpr):
    HW: gl.constexpr = HD // 2
    layout: gl.constexpr = k_ring.type.layout
    k_desc = tma.make_tensor_descriptor(pool, [num_slots, HKV * HD], [HKV * HD, 1], [PAGE, HW], layout)
    v_desc = tma.make_tensor_descriptor(pool + num_slots * HKV * HD, [num_slots, HKV * HD], [HKV * HD, 1],
                                        [PAGE, HW], layout)
    ids_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    PER: gl.constexpr = BLOCK // PAGE
    i = 0
    for r in range(gl.cdiv(total, P)):
        valid, g, m0, last = _item(r, pid, P, total, HKV, BM, REP, T)
        if valid:
            num_pages = gl.cdiv(last, PAGE)
            for w0 in range(0, num_pages, IDS):
                pw = w0 + gl.arange(0, IDS, layout=ids_layout)
                ids = gl.load(pages + pw, mask=pw < num_pages, other=0)
                for p0 in range(w0, gl.minimum(w0 + IDS, num_pages), PER):
                    s = i % STAGES
                    mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
                    # every page of a slot (a constant byte count): past the last, page 0's keys, masked
                    mbarrier.expect(ready.index(s), 2 * BLOCK * HD * 2)
                    for q in gl.static_range(PER):
                        slot = gl.sum(gl.where(pw == p0 + q, ids, 0), axis=0) * PAGE
                        for h in gl.static_range(2):
                            tma.async_copy_global_to_shared(k_desc, [slot, g * HD + h * HW], ready.index(s),
                                                            k_ring.index(2 * s + h).slice(q * PAGE, PAGE, dim=0))
                            tma.async_copy_global_to_shared(v_desc, [slot, g * HD + h * HW], ready.index(s),
                                                            v_ring.index(2 * s + h).slice(q * PAGE, PAGE, dim=0))
                    i += 1


@gluon.jit
def _scores(q0, q1, k_ring, s, BM: gl.constexpr, BLOCK: gl.constexpr, s_layout: gl.constexpr):
    """Slot s's scores q k^T over the two column halves, asked of the tensor cores (not awaited)."""
    sc = warpgroup_mma(q0, k_ring.index(2 * s).permute((1, 0)), gl.zeros([BM, BLOCK], gl.float32, s_layout),
                       is_async=True)
    return warpgroup_mma(q1, k_ring.index(2 * s + 1).permute((1, 0)), sc, is_async=True)


@gluon.jit
def _softmax_pv(sc, j, keys, q_pos, last, first_token, m, l, o0, o1, v_ring, s, c, BLOCK: gl.constexpr,
                rows_o: gl.constexpr, p_dot: gl.constexpr):
    """The online softmax after the scores of slot s (keys j ..), then its values' sum asked of the tensor cores
    (not awaited). The causal and length masks only on a block that passes the item's first token or the last
    key."""
    if (j + BLOCK - 1 > first_token) | (j + BLOCK > last):
        key = j + keys
        sc = gl.where((key[None, :] <= q_pos[:, None]) & (key < last)[None, :], sc, -1.0e30)
    m_new = gl.maximum(m, gl.max(sc, axis=1))
    p = gl.exp2((sc - m_new[:, None]) * c)
    alpha = gl.exp2((m - m_new) * c)
    a = gl.convert_layout(alpha, rows_o)[:, None]
    pb = gl.convert_layout(p.to(gl.bfloat16), p_dot)
    o0 = warpgroup_mma(pb, v_ring.index(2 * s), o0 * a, is_async=True)
    o1 = warpgroup_mma(pb, v_ring.index(2 * s + 1), o1 * a, is_async=True)
    return m_new, l * alpha + gl.sum(p, axis=1), o0, o1


@gluon.jit
def _consumer(q_ptr, out, k_ring, v_ring, ready, empty, T, total, scale, pid, P, HKV: gl.constexpr,
              HD: gl.constexpr, REP: gl.constexpr, BM: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
              PIPE: gl.constexpr):
    HW: gl.constexpr = HD // 2
    H: gl.constexpr = HKV * REP
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, BLOCK, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                        instr_shape=[16, HW, 16])
    q_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    p_dot: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    qr = gl.arange(0, BM, layout=gl.SliceLayout(1, q_dot))
    qd = gl.arange(0, HW, layout=gl.SliceLayout(0, q_dot))
    keys = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, s_layout))
    sr = gl.arange(0, BM, layout=rows_s)
    orow = gl.arange(0, BM, layout=rows_o)
    od = gl.arange(0, HW, layout=gl.SliceLayout(0, o_layout))
    c = scale * LOG2E
    i = 0
    for r in range(gl.cdiv(total, P)):
        valid, g, m0, last = _item(r, pid, P, total, HKV, BM, REP, T)
        if valid:
            rows = m0 + qr
            q_rows = q_ptr + (rows // REP)[:, None] * (H * HD) + (g * REP + rows % REP)[:, None] * HD + qd[None, :]
            q0 = gl.load(q_rows, mask=(rows < T * REP)[:, None], other=0.0)
            q1 = gl.load(q_rows + HW, mask=(rows < T * REP)[:, None], other=0.0)
            q_pos = (m0 + sr) // REP  # a row's token: it sees keys up to its own
            m = gl.full([BM], -1.0e30, gl.float32, rows_s)
            l = gl.zeros([BM], gl.float32, rows_s)
            o0 = gl.zeros([BM, HW], gl.float32, o_layout)
            o1 = gl.zeros([BM, HW], gl.float32, o_layout)
            if PIPE:
                # the next block's scores asked of the tensor cores before this block's softmax, so that the two
                # overlap (flash attention 3's order within a warp group)
                n = gl.cdiv(last, BLOCK)
                s = i % STAGES
                mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                sc = _scores(q0, q1, k_ring, s, BM, BLOCK, s_layout)
                sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
                for jj in range(n - 1):
                    s = i % STAGES
                    s_next = (i + 1) % STAGES
                    mbarrier.wait(ready.index(s_next), ((i + 1) // STAGES) & 1)
                    sn = _scores(q0, q1, k_ring, s_next, BM, BLOCK, s_layout)
                    m, l, o0, o1 = _softmax_pv(sc, jj * BLOCK, keys, q_pos, last, m0 // REP, m, l, o0, o1, v_ring,
                                               s, c, BLOCK, rows_o, p_dot)
                    sn = warpgroup_mma_wait(num_outstanding=2, deps=(sn, ))
                    o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
                    fence_async_shared()
                    mbarrier.arrive(empty.index(s), count=1)
                    sc = sn
                    i += 1
                s = i % STAGES
                m, l, o0, o1 = _softmax_pv(sc, (n - 1) * BLOCK, keys, q_pos, last, m0 // REP, m, l, o0, o1,
                                           v_ring, s, c, BLOCK, rows_o, p_dot)
                o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
                fence_async_shared()
                mbarrier.arrive(empty.index(s), count=1)
                i += 1
            else:
                for j in range(0, last, BLOCK):
                    s = i % STAGES
                    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
                    sc = _scores(q0, q1, k_ring, s, BM, BLOCK, s_layout)
                    sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
                    m, l, o0, o1 = _softmax_pv(sc, j, keys, q_pos, last, m0 // REP, m, l, o0, o1, v_ring, s, c,
                                               BLOCK, rows_o, p_dot)
                    o0, o1 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1))
                    fence_async_shared()
                    mbarrier.arrive(empty.index(s), count=1)
                    i += 1
            inv = 1.0 / gl.convert_layout(l, rows_o)[:, None]
            orows = m0 + orow
            o_ptr = out + (orows // REP)[:, None] * (H * HD) + (g * REP + orows % REP)[:, None] * HD + od[None, :]
            ok = (orows < T * REP)[:, None]
            gl.store(o_ptr, (o0 * inv).to(gl.bfloat16), mask=ok)
            gl.store(o_ptr + HW, (o1 * inv).to(gl.bfloat16), mask=ok)


@gluon.jit
def ws_prefill_attend(q, pool, pages, out, T, num_slots, scale, HKV: gl.constexpr, HD: gl.constexpr,
                      REP: gl.constexpr, PAGE: gl.constexpr, BLOCK: gl.constexpr, STAGES: gl.constexpr,
                      IDS: gl.constexpr, LOADER_REGS: gl.constexpr, PIPE: gl.constexpr):
    """Causal attention of one sequence's T tokens (q [T, H * HD]) over its keys and values in the pool ([2,
    num_slots, HKV * HD], token t at page pages[t // PAGE]); out [T, H * HD]."""
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    BM: gl.constexpr = 16 * gl.num_warps()
    total = gl.cdiv(T * REP, BM) * HKV
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, HD // 2], gl.bfloat16)
    k_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 2, BLOCK, HD // 2], layout)
    v_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 2, BLOCK, HD // 2], layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_consumer, (q, out, k_ring, v_ring, ready, empty, T, total, scale, pid, P, HKV, HD, REP, BM, BLOCK, STAGES,
                     PIPE)),
        (_loader, (pool, pages, k_ring, v_ring, ready, empty, T, num_slots, total, pid, P, HKV, HD, REP, BM, PAGE,
                   BLOCK, STAGES, IDS)),
    ], [1], [LOADER_REGS])


def options(block, stages, warps, pipe=0, page=16):
    return dict(HKV=8, HD=128, REP=4, PAGE=page, BLOCK=block, STAGES=stages, IDS=32, LOADER_REGS=40, PIPE=pipe,
                num_warps=warps, maxnreg=65536 // ((warps + 4) * 32) // 8 * 8)


def variants(spec):
    """'64/3/8,64/3/8/1' -> [(BLOCK, STAGES, warps, PIPE)]."""
    return [tuple(int(x) for x in v.split("/")) + (0, ) * (4 - len(v.split("/"))) for v in spec.split(",")]


def compile_only(specs):
    sig = {"q": "*bf16", "pool": "*bf16", "pages": "*i32", "out": "*bf16", "T": "i32", "num_slots": "i32",
           "scale": "fp32"}
    for block, stages, warps, pipe in specs:
        compile_sm90(ws_prefill_attend, sig, options(block, stages, warps, pipe),
                     f"{block} keys a slot, {stages} stages, {warps} warps, pipe {pipe}")


def run_gpu(specs, prompts, reps):
    from benchmarks.explore.prefill_attention import prefill_items
    dev = torch.device("cuda")
    use_global_scratch(dev)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    H, HKV, HD, PAGE = 32, 8, 128, 16  # Llama-3-8B, the cache's pages
    scale = HD ** -0.5
    print(torch.cuda.get_device_name(), flush=True)
    for T in prompts:
        gen = torch.Generator(device=dev).manual_seed(T)
        q = torch.randn(T, H * HD, device=dev, dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(T, HKV * HD, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(2))
        qh, kh, vh = (x.view(T, -1, HD).transpose(0, 1)[None] for x in (q, k, v))
        ref = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
        flops = 4 * H * HD * T * (T + 1) / 2
        sdpa = graph_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True), reps)
        print(f"prompt {T}: SDPA {sdpa * 1e3:7.1f} us ({flops / sdpa / 1e9:4.0f} TFLOP/s causal)", flush=True)
        num_pages = -(-T // PAGE)
        pages = torch.randperm(num_pages, device=dev, generator=gen).to(torch.int32)
        pool = torch.zeros(2, num_pages * PAGE, HKV * HD, device=dev, dtype=torch.bfloat16)
        slots = (pages.long()[:, None] * PAGE + torch.arange(PAGE, device=dev)).flatten()[:T]
        pool[0, slots], pool[1, slots] = k, v
        out = torch.empty_like(q)

        def error():
            return ((out.view(T, H, HD).transpose(0, 1)[None].float() - ref.float()).abs().max()).item()

        def kernel_loop():  # the megakernel's `attend` on its items (prefill_attention.py's "paged")
            prefill_items[(264, )](q, q, pool, pages, out, T, pool.shape[1], scale, H, HKV, HD, 64, 32, 3, 0, PAGE,
                                   num_warps=4)
        out.fill_(float("nan"))
        kernel_loop()
        ms = graph_ms(kernel_loop, reps)
        print(f"RESULT prompt {T} the megakernel's loop (264 programs): {ms * 1e3:7.1f} us "
              f"({flops / ms / 1e9:4.0f} TFLOP/s, {sdpa / ms:.2f}x SDPA) max err {error():.1e}", flush=True)
        for block, stages, warps, pipe in specs:
            opts = options(block, stages, warps, pipe, PAGE)

            def launch():
                ws_prefill_attend[(sms, )](q, pool, pages, out, T, pool.shape[1], scale, **opts)
            out.fill_(float("nan"))
            try:
                launch()
                torch.cuda.synchronize()
            except Exception as exc:  # a variant that does not compile or launch: say so, go on with the others
                print(f"  {block}/{stages}/{warps}/{pipe}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            err = error()
            ms = graph_ms(launch, reps)
            print(f"RESULT prompt {T} ws {block} keys a slot, {stages} stages, {warps} warps"
                  f"{', next scores first' if pipe else ''}: {ms * 1e3:7.1f} us "
                  f"({flops / ms / 1e9:4.0f} TFLOP/s, {sdpa / ms:.2f}x SDPA) max err {err:.1e}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--variants", default="64/3/8,64/3/8/1,64/4/4/1", help="BLOCK/STAGES/warps[/PIPE], "
                        "comma-separated")
    parser.add_argument("--prompts", default="512,2048")
    parser.add_argument("--reps", type=int, default=20, help="launches a CUDA graph (timings: its replays)")
    args = parser.parse_args()
    if args.compile_only:
        compile_only(variants(args.variants))
    else:
        run_gpu(variants(args.variants), [int(p) for p in args.prompts.split(",")], args.reps)


if __name__ == "__main__":
    main()
