"""What a sampling cut costs the one program that settles it, piece by piece (probe, not the kernel).

When a row's Gumbel-max draw fails its top-k test, the last sampling task of the row runs, alone: a count pass
(`_masses`), the exact k-th largest z (`_kth_largest`), and a redraw over the kept tokens (`_gumbel_max` with a
floor). This probe times each piece on one program over a Llama-3 row of 128,256 logits, N(0, 1) as random
weights give them (flat: a draw at temperature 0.8 lands outside the top 50 almost always), next to an empty
launch:

    python -m benchmarks.explore.sample_cut                      # on an H100 / H200
    python -m benchmarks.explore.sample_cut --top-k 50 --temperature 0.8 --vocab 128256 --digits 4,5,6,8
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from benchmarks.baselines import median_ms
from codegen.bodies.schedule import _gumbel_max, _kth_largest, _masses

PIECES = ("empty", "masses", "select", "select_from_draw", "noise", "redraw", "redraw_in_quarters")


@triton.jit
def _piece(F32, CANDS, OUT, vocab, temperature, k, draw_logit, top_logit, kth_logit, PIECE: tl.constexpr,
           VB: tl.constexpr, DIGIT: tl.constexpr):
    z_draw = draw_logit / temperature
    z_top = top_logit / temperature
    result = 0.0
    if PIECE == 1:
        count, above, kept = _masses(F32, 0, vocab, VB, temperature, z_draw, z_draw, z_top)
        result = count.to(tl.float32) + above + kept
    elif PIECE == 2:
        result = _kth_largest(F32, 0, vocab, VB, temperature, k, tl.full((), float("-inf"), tl.float32), z_top,
                              CANDS, DIGIT)
    elif PIECE == 3:
        z_low = tl.where(z_draw < z_top, z_draw, float("-inf"))  # (main passes +inf unless k tokens lie above)
        result = _kth_largest(F32, 0, vocab, VB, temperature, k, z_low, z_top, CANDS, DIGIT)
    elif PIECE == 4:
        result = _gumbel_max(F32, 0, 0, vocab, vocab, VB, 7, 0, temperature, float("-inf"), float("-inf"))[0]
    elif PIECE == 5:
        result = _gumbel_max(F32, 0, 0, vocab, vocab, VB, 7, 0, temperature, float("-inf"),
                             kth_logit / temperature)[0]
    elif PIECE == 6:  # the same in blocks a quarter as wide: fewer of them hold a kept token
        result = _gumbel_max(F32, 0, 0, vocab, vocab, VB // 4, 7, 0, temperature, float("-inf"),
                             kth_logit / temperature)[0]
    tl.store(OUT, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--digits", default="6", help="bits a pass of the selects to time, comma-separated")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda")
    block = min(4096, triton.next_power_of_2(args.vocab))  # the kernel's `sample_wide`
    logits = torch.randn(args.vocab, generator=torch.Generator().manual_seed(0)).to(device)
    z = logits / args.temperature
    draw = int(torch.argmax(z - torch.log(-torch.log(torch.rand_like(z)))))  # a draw as the kernel makes one
    above = int((z > z[draw]).sum())
    kth = float(logits.topk(args.top_k).values[-1])
    print(f"{args.vocab} logits, temperature {args.temperature}, top_k {args.top_k}: the draw has {above} tokens "
          f"above it")
    cands, out = torch.zeros(block + 1, device=device), torch.zeros(1, device=device)
    base = None
    for index, name in enumerate(PIECES):
        for digit in [int(d) for d in args.digits.split(",")] if name.startswith("select") else [6]:
            def launch(piece=index, digit=digit):
                # a floor for the select from the draw only where k tokens lie above it, as in `_draw_within`
                draw_logit = float(logits[draw]) if piece != 3 or above >= args.top_k else float("inf")
                _piece[(1,)](logits, cands, out, args.vocab, args.temperature, args.top_k, draw_logit,
                             float(logits.max()), kth, piece, block, digit)
            launch()
            if name.startswith("select"):
                assert float(out) == float(z.topk(args.top_k).values[-1]), (name, float(out))
                name_shown = f"{name} ({digit} bits)"
            else:
                name_shown = name
            ms = median_ms(launch, device, num_warmup=5, num_reps=50)
            base = ms if base is None else base
            print(f"{name_shown:>27}: {ms * 1e3:8.1f} us ({(ms - base) * 1e3:7.1f} over an empty launch)")


if __name__ == "__main__":
    main()
