"""`python -m codegen.gluon [--json]`: every Gluon body's variants compiled for sm_90 (no GPU needed), with each one's
registers, spills and shared memory. A process of its own: under TRITON_INTERPRET (the CPU tests') Triton's library
functions are the interpreter's, which a compile cannot take."""
from __future__ import annotations

import argparse
import dataclasses
import json

from codegen.bodies.linear import OUT_ALIGNED, OUT_F32
from codegen.gluon import compile_for_sm90
from codegen.gluon import attention, batch, chain, gemv, linear, qkv


def variants():
    """(name, kernel, signature, constexprs, launch options) of every body's compiled variants."""
    for tiles_name in ("WIDE", "NARROW"):
        tiles = getattr(linear, tiles_name)
        for gated in (False, True):
            for norm_f64 in (True, False):
                name = f"linear_prefill {linear.BM.value}x{tiles.bn} {tiles.stages} stages" \
                       f"{' gated' if gated else ''}{' fp32 sums' if not norm_f64 else ''}"
                yield name, linear.linear_prefill, linear.SIGNATURE, tiles.constexprs(gated, norm_f64), linear.LAUNCH
    tiles = linear.STREAMK
    for gated in (False, True):
        name = f"linear_prefill stream-K {tiles.bm}x{tiles.bn} {tiles.stages} stages{' gated' if gated else ''}"
        yield name, linear.linear_prefill, linear.SIGNATURE, tiles.constexprs(gated, True, True), tiles.launch()
    tiles = qkv.STREAMK
    yield f"qkv_prefill stream-K {tiles.bm}x{tiles.bn} {tiles.stages} stages", qkv.qkv_prefill, qkv.SIGNATURE, \
        qkv.constexprs(tiles, True, True), qkv.launch(tiles, True)
    for tiles_name in ("WIDE", "NARROW"):
        tiles = getattr(linear, tiles_name)
        for norm_f64 in (True, False):
            split = ", an epilogue partition" if qkv.split_epilogue(tiles) else ""
            name = f"qkv_prefill {tiles.bm}x{tiles.bn} {tiles.stages} stages{split}" \
                   f"{' fp32 sums' if not norm_f64 else ''}"
            yield name, qkv.qkv_prefill, qkv.SIGNATURE, qkv.constexprs(tiles, norm_f64), qkv.launch(tiles)
    for launch in (attention.LAUNCH, attention.DECODE_LAUNCH):
        for max_batch in (1, 64):  # (the sequences' lanes: 32 or 64)
            name = f"attention_prefill {16 * launch['num_warps']}-row items, {attention.BLOCK} keys a slot, " \
                   f"{attention.STAGES} stages, max_batch {max_batch}"
            yield name, attention.attention_prefill, attention.SIGNATURE, attention.constexprs(16, 128, max_batch), \
                launch
    for max_batch in (1, 64):
        name = f"attention_prefill split decode steps, 64-row items, max_batch {max_batch}"
        yield name, attention.attention_prefill, attention.SIGNATURE, \
            attention.constexprs(16, 128, max_batch, split=True), attention.DECODE_LAUNCH
    for rows in gemv.UNIT_ROWS:
        for gated, out_kind in ((False, OUT_ALIGNED), (True, OUT_ALIGNED), (False, OUT_F32)):
            name = f"linear_gemv {rows}-row units{' gated' if gated else ''}{' fp32 logits' if out_kind else ''}"
            yield name, gemv.linear_gemv, gemv.SIGNATURE, gemv.constexprs(rows, gated, out_kind, True), gemv.LAUNCH
        yield f"qkv_gemv {rows}-row units", gemv.qkv_gemv, gemv.QKV_SIGNATURE, gemv.qkv_constexprs(rows, True), \
            gemv.LAUNCH
    yield "prefill_chain", chain.prefill_chain, chain.SIGNATURE, chain.constexprs(16, 128, 64, True), chain.LAUNCH
    yield "batch_chain", batch.batch_chain, batch.BATCH_SIGNATURE, batch.constexprs(16, 128, 64, True, 16), \
        batch.LAUNCH
    yield "decode_chain 16-row units", chain.decode_chain, chain.DECODE_SIGNATURE, \
        chain.decode_constexprs(16, 16, 128, 1, True, 16), chain.DECODE_LAUNCH
    yield "decode_chain 16-row units, the loop's constexprs", chain.decode_chain, chain.DECODE_SIGNATURE, \
        chain.decode_constexprs(16, 16, 128, 1, True, 16, 1, 2048, 1024, 64), chain.DECODE_LAUNCH
    yield "decode_chain 16-row units, the loop sampling with temperatures", chain.decode_chain, \
        chain.DECODE_SIGNATURE, chain.decode_constexprs(16, 16, 128, 1, True, 16, 1, 2048, 1024, 64, 4096, True), \
        chain.DECODE_LAUNCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true",
                        help="one JSON object: variant -> its resources and launch options")
    args = parser.parse_args()
    found = {}
    for name, kernel, signature, constexprs, launch in variants():
        counts = {}
        used = compile_for_sm90(kernel, signature, constexprs, **launch, counts=counts)
        found[name] = {**dataclasses.asdict(used), **counts, **launch}
        if not args.json:
            print(f"{name}, {launch['num_warps']} consumer warps: {used}", flush=True)
    if args.json:
        print(json.dumps(found))


if __name__ == "__main__":
    main()
