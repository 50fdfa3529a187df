"""The megakernel's activations after one prefill step against the host-driven baseline's, region by region: where
a persistent run first goes wrong. Both start from arenas filled with NaN, so that a value read before its
producer wrote it shows as NaN instead of as the last run's (correct) value. GPU only.

    python -m benchmarks.explore.region_diff --batch 64 --min-len 40 --max-len 250 --runs 8 [--variant prefill_tma=0]

Each variant is compiled side by side; the baseline runs the first variant's bodies group by group (launch
order is the dependency order), twice, to show its own noise: a few hundred values of a region a bf16 ulp or
two apart. A launch whose logits are more than 10% off also shows the planner's words against the baseline's
and which token each wrong embedding row holds.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from benchmarks.megakernel_tpot import parse_field
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.config import CompileConfig
from models.registry import resolve_model
from runtime.host_driven import HostDriven
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


@dataclasses.dataclass
class Snapshot:
    act: torch.Tensor
    kv: torch.Tensor
    logits: torch.Tensor


def fill_nan(kernel: Megakernel) -> None:
    kernel.act.fill_(float("nan"))
    kernel.kv.fill_(float("nan"))


def snapshot(kernel: Megakernel, batch: int) -> Snapshot:
    torch.cuda.synchronize()
    return Snapshot(kernel.act.clone(), kernel.kv.clone(), kernel.last_logits().clone())


def differences(kernel: Megakernel, got: Snapshot, want: Snapshot, num_tokens: int, limit: int = 6) -> list[str]:
    """The ACT regions (in allocation order) and KV layers that differ, the first `limit` of each, with the rows
    (tokens) that do where a region has a row a token."""
    lines = []
    regions = sorted(((offset, name, size) for name, (arena, offset, size) in kernel.layout["regions"].items()
                      if arena == "ACT"))
    for offset, name, size in regions:
        line = _compare(name, got.act[offset:offset + size], want.act[offset:offset + size])
        if line:
            if size % num_tokens == 0:
                line += "; rows " + _ranges(_bad_rows(got.act[offset:offset + size].view(num_tokens, -1),
                                                      want.act[offset:offset + size].view(num_tokens, -1)))
            lines.append(line)
        if len(lines) >= limit:
            break
    layers = kernel.manifest["model"]["num_layers"]
    for layer in range(layers):
        plane = kernel.kv_plane
        for i, part in enumerate("KV"):
            at = (layer * 2 + i) * plane
            line = _compare(f"kv {part} layer {layer}", got.kv[at:at + plane], want.kv[at:at + plane])
            if line and len(lines) < 2 * limit:
                lines.append(line)
    return lines


def _bad_rows(got: torch.Tensor, want: torch.Tensor) -> list[int]:
    """Rows (of [rows, width] views) with a value far from the baseline's or NaN in one of them only."""
    far, got_nan, want_nan, _, _ = _mismatch(got, want)
    return (far | got_nan | want_nan).any(1).nonzero().flatten().tolist()


def _mismatch(got: torch.Tensor, want: torch.Tensor):
    """(values more than 5% of the baseline's largest apart, NaN in got only, NaN in want only, the largest
    difference, the baseline's largest value)."""
    got_nan, want_nan = torch.isnan(got), torch.isnan(want)
    both = ~got_nan & ~want_nan
    diff = (got.float() - want.float()).abs().where(both, 0)
    scale = want.float().abs().where(both, 0).max().clamp_min(1e-6)
    return diff > 0.05 * scale, got_nan & ~want_nan, want_nan & ~got_nan, float(diff.max()), float(scale)


def _ranges(rows: list[int]) -> str:
    """Sorted indices as spans, '3-5, 9 (4 rows)'."""
    spans, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        if i + 1 == len(rows) or rows[i + 1] != row + 1:
            spans.append(f"{start}" if start == row else f"{start}-{row}")
            start = None
    return ", ".join(spans[:12]) + (f" ... ({len(spans)} spans, {len(rows)} rows)" if len(spans) > 12 else
                                    f" ({len(rows)} rows)")


def plan_differences(kernel: Megakernel, want_i32: torch.Tensor) -> list[str]:
    """The step's inputs the planner wrote (token ids, positions, slots, sequence extents), where they differ."""
    lines = []
    for name in ("input_ids", "positions", "slots", "seq_starts", "context_lens", "seq_req", "logits_rows"):
        offset, size = kernel.region(name)
        got, want = kernel.i32[offset:offset + size].cpu(), want_i32[offset:offset + size]
        bad = (got != want).nonzero().flatten().tolist()
        if bad:
            lines.append(f"plan {name}: {len(bad)} words differ, at " + _ranges(bad) + f"; first got "
                         f"{got[bad[:4]].tolist()} want {want[bad[:4]].tolist()}")
    return lines


def embedding_rows(kernel: Megakernel, got: Snapshot, want: Snapshot, region: str, input_ids: torch.Tensor) -> str:
    """For the embedding's wrong rows: the token whose table row each one holds, against the token it should."""
    offset, size = kernel.region(region)
    rows = _bad_rows(got.act[offset:offset + size].view(len(input_ids), -1),
                     want.act[offset:offset + size].view(len(input_ids), -1))[:16]
    if not rows:
        return f"{region}: no wrong rows"
    table = kernel.weight_views["model.embed_tokens.weight"]
    held = (got.act[offset:offset + size].view(len(input_ids), -1)[rows].float() @ table.float().T).argmax(1)
    return f"{region} rows {rows}: hold tokens {held.tolist()}, should hold {input_ids[rows].tolist()}"


def _compare(name: str, got: torch.Tensor, want: torch.Tensor) -> str:
    far, got_nan, want_nan, largest, scale = _mismatch(got, want)
    far, got_nan, want_nan = int(far.sum()), int(got_nan.sum()), int(want_nan.sum())
    if far > 100 or got_nan or want_nan:  # a few values apart is bf16 noise: the baseline differs from itself so
        return (f"{name}: {far} of {got.numel()} differ by more than 5% of its largest value (max diff "
                f"{largest:.3g} of {scale:.3g}), {got_nan} NaN where the baseline has a value, {want_nan} values "
                f"where it has NaN")
    return ""


def overrides(variant: str) -> dict:
    """`field=value,...` as CompileConfig fields."""
    return {key: parse_field(value) for key, value in (item.split("=", 1) for item in variant.split(",") if item)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=40)
    parser.add_argument("--max-len", type=int, default=250)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--variant", action="append", default=[], help="config overrides, e.g. prefill_tma=0")
    parser.add_argument("--base", default="share_activations=0",
                        help="overrides of every kernel's config (default: every buffer a region of its own, so that "
                             "each can be compared)")
    parser.add_argument("--out", default="/tmp/blink-region-diff")
    parser.add_argument("--embedding-region", default="v40", help="the embedding's output (Llama-3-8B: v40)")
    args = parser.parse_args()
    model = resolve_model(args.preset)
    lengths = torch.randint(args.min_len, args.max_len, (args.batch,),
                            generator=torch.Generator().manual_seed(7)).tolist()
    base = CompileConfig(max_batch=args.batch, max_tokens_per_step=sum(lengths), max_model_len=512, max_new_tokens=8,
                         **overrides(args.base))
    variants = [""] + args.variant
    configs = [dataclasses.replace(base, **overrides(v)) for v in variants]
    print(f"{args.batch} prompts, {sum(lengths)} tokens; compiled {len(configs)} kernels in "
          f"{compile_many([(args.preset, c) for c in configs]):.0f} s", flush=True)
    g = torch.Generator().manual_seed(args.batch)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    want = None
    for variant, config in zip(variants, configs):
        out = Path(args.out) / (variant.replace(",", "-").replace("=", "") or "default") / "model.cubin"
        path = compile_model(model, config, out, WeightsSource(seed=1)).path
        kernel = Megakernel.load(path, device="cuda", timeout_s=120)
        if want is None:
            driver = HostDriven(kernel)
            for run in range(2):
                kernel.prepare(prompts, params)
                fill_nan(kernel)
                start = time.perf_counter()
                driver.step(0)
                got = snapshot(kernel, args.batch)
                print(f"baseline run {run}: {time.perf_counter() - start:.2f} s, logits NaN "
                      f"{int(torch.isnan(got.logits).sum())}", flush=True)
                if want is None:
                    want, want_i32 = got, kernel.i32.cpu()
                    at = kernel.region("input_ids")[0]
                    want_ids = want_i32[at:at + sum(lengths)]
                else:
                    lines = differences(kernel, got, want, len(want_ids)) or ["identical"]
                    print("  baseline against itself: " + "\n  ".join(lines), flush=True)
            want_layout, driver = kernel.layout, None
        if kernel.layout != want_layout:
            print(f"variant {variant!r}: another layout, logits compared only")
        failed = 0
        for run in range(args.runs):
            kernel.prepare(prompts, params)
            fill_nan(kernel)
            kernel.generate(prompts, params)
            got = snapshot(kernel, args.batch)
            err = float((got.logits - want.logits).norm() / want.logits.norm())
            wrong = not err < 0.1
            lines = differences(kernel, got, want, len(want_ids)) if kernel.layout == want_layout else []
            if wrong and lines:
                lines += plan_differences(kernel, want_i32)
                lines.append(embedding_rows(kernel, got, want, args.embedding_region, want_ids))
            failed += wrong
            print(f"variant {variant or 'default'!r} run {run}: logits relative difference {err:.4f}", flush=True)
            for line in lines:
                print("  " + line, flush=True)
        print(f"variant {variant or 'default'!r}: {failed} of {args.runs} runs differ", flush=True)
        del kernel
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
