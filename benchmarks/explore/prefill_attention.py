"""How fast can a prefill's causal attention run in the megakernel's shape of program? (probe)

At 2,048 tokens the megakernel's prefill attention takes ~173 us a Llama-3-8B layer (`profile_step --prefill
--context 2048`) where torch's SDPA (the baseline's call: causal, GQA; printed here first) takes ~84. ncu puts its
loop's stalls on the barrier before each block's QK dot (every warp's key copies landed) and on the key and value
addresses (page ids gathered, 64-bit rows). This probe runs the kernel's own `attend` (paged keys, per-thread
copies) and `attend_step` (the step's keys stored contiguously and read by tensor descriptors, TMA: one bulk copy a
block, no addresses, no copy barrier) on the kernel's items (a block of query rows, tokens x the heads of a KV
group, and its KV head), handed out in the kernel's zigzag over a persistent grid, next to SDPA on the same tensors.

    python -m benchmarks.explore.prefill_attention --prompts 512,2048
    python -m benchmarks.explore.prefill_attention --variants "paged tma tma,bkv=64"

A variant is a mode (paged: `attend` over a shuffled page table; tma: contiguous keys through descriptors;
pages_tma: the shuffled pages through descriptors on the pool, a block a page or part of one) and comma-separated
fields: page (keys a page), bkv (keys a block), bm (query rows a block), stages, programs (the persistent grid), warps.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.baselines import median_ms
from benchmarks.explore.variant_fields import with_kind
from codegen.bodies.attention import attend, attend_block, attend_step, attention_start
from runtime.megakernel import use_scratch_allocator


@triton.jit
def attend_pages_tma(q, q_pos, j_hi, pages, kd, vd, col0, scale, PAGE_SIZE: tl.constexpr, BKV: tl.constexpr,
                     STAGES: tl.constexpr):
    """`attend_step` over paged keys, pages of at least BKV keys: block j0's keys start at row
    pages[j0 // PAGE_SIZE] * PAGE_SIZE + j0 % PAGE_SIZE of the pool's descriptors."""
    m_i, l_i, acc = attention_start(q)
    for j0 in tl.range(0, j_hi, BKV, num_stages=STAGES):
        row = tl.load(pages + j0 // PAGE_SIZE) * PAGE_SIZE + j0 % PAGE_SIZE
        k = kd.load([row, col0])
        v = vd.load([row, col0])
        m_i, l_i, acc = attend_block(q, k, v, j0 + tl.arange(0, BKV), j_hi, q_pos, m_i, l_i, acc, scale, False,
                                     False)
    return m_i, l_i, acc


@triton.jit
def prefill_items(Q, STEP_KV, KV, PAGES, OUT, T, num_slots, scale, H: tl.constexpr, HKV: tl.constexpr,
                  HD: tl.constexpr, BM: tl.constexpr, BKV: tl.constexpr, STAGES: tl.constexpr, MODE: tl.constexpr,
                  PAGE_SIZE: tl.constexpr):
    """Item i = (query block i // HKV, KV head i % HKV), a task taking items tile, 2n - 1 - tile, 2n + tile...
    of the grid's n programs (the kernel's zigzag). q [T, H * HD]; the keys and values of token t at STEP_KV
    row t ([K heads, V heads], as the kernel's `step_kv` rows: MODE 1, the kernel's `attend_step`), or in the
    pool KV [2, num_slots, HKV * HD] at page PAGES[t // PAGE_SIZE]'s row (MODE 0, the kernel's `attend`; 2:
    through descriptors on the pool)."""
    REP: tl.constexpr = H // HKV
    tile, n = tl.program_id(0), tl.num_programs(0)
    total = tl.cdiv(T * REP, BM) * HKV
    d = tl.arange(0, HD)
    d_ok = d < HD
    if MODE == 1:
        kd = tl.make_tensor_descriptor(STEP_KV, shape=[T, 2 * HKV * HD], strides=[2 * HKV * HD, 1],
                                       block_shape=[BKV, HD])
        vd = kd
    else:
        kd = tl.make_tensor_descriptor(KV, shape=[num_slots, HKV * HD], strides=[HKV * HD, 1],
                                       block_shape=[BKV, HD])
        vd = tl.make_tensor_descriptor(KV + num_slots * HKV * HD, shape=[num_slots, HKV * HD],
                                       strides=[HKV * HD, 1], block_shape=[BKV, HD])
    for r in range(0, tl.cdiv(total, n)):
        item = r * n + tl.where(r % 2 == 0, tile, n - 1 - tile)
        if item < total:
            g, m0 = item % HKV, (item // HKV) * BM
            rows = m0 + tl.arange(0, BM)
            r_ok = rows < T * REP
            tok, head = rows // REP, g * REP + rows % REP
            q = tl.load(Q + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :], mask=r_ok[:, None], other=0.0)
            last = tl.minimum(T, (m0 + BM - 1) // REP + 1)
            if MODE == 1:
                m_i, l_i, acc = attention_start(q)
                m_i, l_i, acc = attend_step(q, tok, 0, last, kd, 0, g * HD, (HKV + g) * HD, scale, m_i, l_i, acc,
                                            BKV, False, STAGES, False)
            elif MODE == 2:
                m_i, l_i, acc = attend_pages_tma(q, tok, last, PAGES, kd, vd, g * HD, scale, PAGE_SIZE, BKV, STAGES)
            else:
                m_i, l_i, acc = attend(q, tok, 0, last, PAGES, KV + g * HD, KV + num_slots * HKV * HD + g * HD,
                                       HKV * HD, d, d_ok, scale, PAGE_SIZE, BKV, False, STAGES, 512 // BKV, False)
            tl.store(OUT + tok[:, None] * (H * HD) + head[:, None] * HD + d[None, :], (acc / l_i[:, None]).to(
                OUT.dtype.element_ty), mask=r_ok[:, None])


MODES = ("paged", "tma", "pages_tma")


def behind(fn, before, num_reps: int = 10) -> float:
    """Median ms of `fn` alone, CUDA events around it, each time right after `before` ran."""
    times = []
    for _ in range(num_reps):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[num_reps // 2]


@dataclass(frozen=True)
class Variant:
    mode: str
    page: int = 16  # keys a page (`CompileConfig.page_size`)
    bkv: int = 32
    bm: int = 64
    stages: int = 3
    programs: int = 264
    warps: int = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="512,2048")
    parser.add_argument("--hot", type=int, default=0, metavar="N",
                        help="also time each variant (CUDA events around it alone) right after N GEMMs of ~1.6 ms "
                             "each: at the clocks a prefill's GEMMs leave")
    parser.add_argument("--variants", default="paged tma pages_tma,page=32 pages_tma,page=32,stages=4 "
                        "pages_tma,page=64 pages_tma,page=64,bkv=64,stages=2")
    args = parser.parse_args()
    use_scratch_allocator()
    device = torch.device("cuda")
    H, HKV, HD = 32, 8, 128  # Llama-3-8B
    scale = HD ** -0.5
    print(torch.cuda.get_device_name())
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) if args.hot else None
    gemms = lambda: [a @ a for _ in range(args.hot)]  # noqa: E731
    for T in (int(v) for v in args.prompts.split(",")):
        gen = torch.Generator(device=device).manual_seed(T)
        q = torch.randn(T, H * HD, device=device, dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(T, HKV * HD, device=device, dtype=torch.bfloat16, generator=gen) for _ in range(2))
        step_kv = torch.cat([k, v], dim=1)  # a row a token: every KV head's key, then every value
        qh, kh, vh = (x.view(T, -1, HD).transpose(0, 1)[None] for x in (q, k, v))

        def sdpa_call(qh=qh, kh=kh, vh=vh):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)

        ref = sdpa_call()
        sdpa = median_ms(sdpa_call, device, num_warmup=10, num_reps=50)
        flops = 4 * H * HD * T * (T + 1) / 2
        hot = ""
        if args.hot:
            hot = f", behind GEMMs {behind(sdpa_call, gemms) * 1e3:.1f} us"
        print(f"prompt {T}: SDPA {sdpa * 1e3:.1f} us ({flops / sdpa / 1e9:.0f} TFLOP/s causal{hot})")
        for spec in args.variants.split():
            var = with_kind(Variant, spec, MODES)
            num_pages = -(-T // var.page)
            pages = torch.randperm(num_pages, device=device, generator=gen).to(torch.int32)
            pool = torch.zeros(2, num_pages * var.page, HKV * HD, device=device, dtype=torch.bfloat16)
            slots = (pages.long()[:, None] * var.page + torch.arange(var.page, device=device)).flatten()[:T]
            pool[0, slots], pool[1, slots] = k, v
            out = torch.empty_like(q)
            run = lambda: prefill_items[(var.programs,)](  # noqa: E731
                q, step_kv, pool, pages, out, T, pool.shape[1], scale, H, HKV, HD, var.bm, var.bkv, var.stages,
                MODES.index(var.mode), var.page, num_warps=var.warps)
            run()
            err = ((out.view(T, H, HD).transpose(0, 1)[None].float() - ref.float()).abs().max()).item()
            ms = median_ms(run, device, num_warmup=5, num_reps=30)
            hot = ""
            if args.hot:
                hot = f", behind GEMMs {behind(run, gemms) * 1e3:.1f} us"
            print(f"  {spec:<32} {ms * 1e3:7.1f} us ({flops / ms / 1e9:4.0f} TFLOP/s, {sdpa / ms:.2f}x SDPA{hot})  "
                  f"max err {err:.1e}")


if __name__ == "__main__":
    main()
