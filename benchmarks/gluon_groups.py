"""The Gluon bodies against the Triton ones, group by group, in one step of the host-driven executor.

For each prompt length (`--prompts`): the TTFT benchmark's kernel (`megakernel_tpot.ttft_config`) and its first step;
for each batch x context (`--decode`): the decode benchmark's kernel (`megakernel_tpot.decode_config`) and a step that
decodes the whole batch. The step runs in the host-driven executor twice, with the Triton group kernels and with the
Gluon bodies where they apply (`HostDriven(kernel, gluon=True)`; codegen/gluon). Each group's launch is timed with CUDA
events (the best of `--repeats` steps) and each kind of group's times are summed over the layers; each covered
group's outputs are checked against the Triton group's on the same inputs (attention's after its merge group). Beside
them: for a prompt the two runs' logits and first tokens, a third run with the layers' Gluon groups as one persistent
launch (`HostDriven(kernel, gluon=True, chain=True)`, codegen/gluon/chain.py) against them, the persistent megakernel's
TTFT and torch's prefill of the same prompt, measured in the same run; for a batch the persistent kernel's TPOT and
the step's launches replayed from one CUDA graph, with the Triton groups and with the Gluon bodies and the chain.

    python -m benchmarks.gluon_groups --prompts 2048,512 --decode 64x512     # on an H100 / H200
    python -m benchmarks.gluon_groups --prompts 2048,512 --decode 64x512 --compile-only   # here: into the cache
"""
from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

import torch

from benchmarks import baselines
from benchmarks.decode import graph_step_ms, steps_until_all_decode
from benchmarks.megakernel_tpot import (artifact_path, decode_config, decode_tokens, full_batch_step_ms,
                                        seeded_prompt, tpot_ms, ttft_config, ttft_ms)
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.bodies.attention import ATTENTION_FIELDS
from codegen.bodies.linear import LINEAR_FIELDS, OUT_F32
from codegen.bodies.qkv import QKV_FIELDS
from codegen.gluon import gemv, linear
from codegen.tasks import Kind
from models.registry import resolve_model
from runtime.host_driven import HostDriven
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


HOLD_CYCLES = 200_000_000  # ~0.1 s at the H200's 1.98 GHz: the step's ~230 launches take the host ~20 ms
DECODE_STEPS = 24  # steps a decode row's kernel has room for once the whole batch decodes
GRAPH_REPLAYS = 10  # a decode row's step from a CUDA graph: replays timed (each decodes a token more)


def group_kind(event: str) -> str:
    """A group's event name without its layer: `model.layers.3.mlp.down_proj.weight` -> `mlp.down_proj`."""
    return re.sub(r"\.weight$", "", re.sub(r"^model\.layers\.\d+\.|\.\d+$", "", event))


def timed_step(driver: HostDriven, step: int) -> dict[int, float]:
    """Step `step` of the prepared requests: each group's ms (by its first task)."""
    size = driver.plan_step(step) or driver.kernel.last_step_size()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(driver.groups) + 1)]
    # the GPU held back while the host launches the step (a Gluon launch takes the host longer than some groups take
    # the GPU: between two events the GPU would wait for the host), so that each event pair times the GPU alone
    torch.cuda._sleep(HOLD_CYCLES)
    events[0].record()
    for (first, count), end in zip(driver.groups, events[1:]):
        driver.launch_group(first, count, step, size)
        end.record()
    torch.cuda.synchronize()
    return {first: start.elapsed_time(end) for (first, _), start, end in zip(driver.groups, events, events[1:])}


def timed_first_step(driver: HostDriven, prompt: list[int]) -> tuple[dict[int, float], torch.Tensor, int]:
    """The first step of `prompt` (prefill and its first token): each group's ms, the logits and the token."""
    k = driver.kernel
    k.prepare([prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    times = timed_step(driver, 0)
    return times, k.last_logits().float().clone(), k.completions(1)[0].tokens[0]


def check_groups(triton: HostDriven, gluon: HostDriven, step: int) -> dict[str, tuple[float, float]]:
    """Step `step` of the prepared requests, each group the Gluon executor covers in it run on the same inputs both
    ways (the arenas as the Triton groups before it left them; attention's outputs compared after the Triton merge
    group that follows it, which the Gluon executor skips): the largest relative error of its outputs (a
    projection's rows and their sums of squares; QKV's q rows and the cache; attention's rows) against the Triton
    group's, and the largest share of outputs that differ at all, by kind."""
    k = triton.kernel
    size = triton.plan_step(step) or k.last_step_size()
    rows = size[0]
    worst: dict[str, float] = defaultdict(float)
    off: dict[str, float] = defaultdict(float)
    descs = k.descs.cpu().tolist()
    merged = {attention: merge for merge, attention in gluon.gluon.merges.items()}
    for first, count in triton.groups:
        if first in gluon.gluon.merges:
            continue  # (run with its attention group, below)
        covered = gluon.gluon.applies(first, size)
        if covered:
            desc = gluon.gluon.descriptor(first)
            outputs = group_outputs(k, Kind(int(k.tasks[first, 0])), descs[desc], rows)
            act, f32, kv = k.act.clone(), k.f32.clone(), k.kv.clone()
        triton.launch_group(first, count, step, size)
        if first in merged:
            triton.launch_group(merged[first], dict(triton.groups)[merged[first]], step, size)
        if not covered:
            continue
        want = [out.double().clone() for out in outputs]
        k.act.copy_(act)
        k.f32.copy_(f32)
        k.kv.copy_(kv)
        for out in outputs[:1]:  # (what the Triton group wrote is not mistaken for the Gluon body's)
            out.fill_(float("nan"))
        gluon.launch_group(first, count, step, size)
        name = group_kind(k.manifest["events"][int(k.tasks[first, 3])])
        if name not in worst and Kind(int(k.tasks[first, 0])) == Kind.QKV:
            f = dict(zip(QKV_FIELDS, descs[desc]))
            print(f"  {name} (first layer): {where_off(outputs[0], want[0], rows, f['head_dim'])}", flush=True)
        for out, expected in zip(outputs, want):
            err = ((out.double() - expected).norm() / expected.norm()).item()
            worst[name] = max(worst[name], err if err == err else float("inf"))  # (NaN: some output not written)
            off[name] = max(off[name], (out.double() != expected).double().mean().item())
    return {name: (err, off[name]) for name, err in worst.items()}


def where_off(got: torch.Tensor, want: torch.Tensor, rows: int, head_dim: int) -> str:
    """Where q rows [rows, heads x head_dim] differ: by half of the head's columns, by head, by row, and by how much."""
    got, want = got.view(rows, -1, head_dim).double(), want.view(rows, -1, head_dim)
    off = got != want
    half = head_dim // 2
    share = off.double()
    by_head = share.mean((0, 2))
    by_row = share.mean((1, 2))
    step = (want.abs().clamp_min(1e-30).log2().floor() - 7).exp2()  # a bf16 step at each value
    steps = ((got - want).abs() / step)[off]
    return (f"{share.mean().item():.2%} of q off: columns below {half} {share[..., :half].mean().item():.2%}, "
            f"above {share[..., half:].mean().item():.2%}; heads {by_head.min().item():.1%}-"
            f"{by_head.max().item():.1%}; rows 0-15 {by_row[:16].mean().item():.1%}, the rest "
            f"{by_row[16:].mean().item():.1%}, row 0 {by_row[0].item():.1%}; "
            f"by {steps.max().item() if steps.numel() else 0:.1f} bf16 steps at most")


def group_outputs(k, kind: Kind, words: list[int], rows: int) -> list[torch.Tensor]:
    """Views of what a covered group writes in a step of `rows` tokens."""
    if kind == Kind.ATTENTION:
        f = dict(zip(ATTENTION_FIELDS, words))
        return [k.act[f["out_off"]:f["out_off"] + rows * f["num_heads"] * f["head_dim"]]]
    if kind == Kind.QKV:
        f = dict(zip(QKV_FIELDS, words))
        width = f["num_q_heads"] * f["head_dim"]
        return [k.act[f["q_out_off"]:f["q_out_off"] + rows * width], k.kv]
    f = dict(zip(LINEAR_FIELDS, words))
    width = f["n"] // 2 if f["gated"] else f["n"]
    rows = k.last_step_size()[1] if f["rows_kind"] == 1 else rows  # (the sequences' last rows: the LM head)
    arena = k.f32 if f["out_kind"] == OUT_F32 else k.act
    out = arena[f["out_off"]:f["out_off"] + rows * f["out_stride"]].view(rows, f["out_stride"])[:, :width]
    return [out] + ([out_sums(k, f["out_stats_off"], rows)] if f["out_stats_off"] >= 0 else [])


def out_sums(k, offset: int, rows: int) -> torch.Tensor:
    """The sums of squares a group adds for its output's rows at F32 word `offset` (fp64 with `exact_norm_sums`)."""
    if k.config.exact_norm_sums:
        return k.f32[offset:offset + 2 * rows].view(torch.float64)
    return k.f32[offset:offset + rows]


def report(triton: HostDriven, best: dict[str, dict[int, float]], worst: dict[str, tuple[float, float]]) -> list[str]:
    """Each kind of group's time both ways, summed over the layers, with its check."""
    k = triton.kernel
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for first, _ in triton.groups:
        kind = group_kind(k.manifest["events"][int(k.tasks[first, 3])])
        by_kind[kind][0] += best["triton"][first]
        by_kind[kind][1] += best["gluon"][first]
    lines = []
    for kind, (t, g) in by_kind.items():
        check = (f", outputs against Triton's rel_err <= {worst[kind][0]:.1e}, at most {worst[kind][1]:.2%} of "
                 f"them off" if kind in worst else "")
        lines.append(f"  {kind:24s} Triton {t * 1e3:8.0f} us  Gluon {g * 1e3:8.0f} us  ({t / max(g, 1e-9):.2f}x)"
                     + check)
    return lines


def drivers(kernel: Megakernel, args) -> tuple[HostDriven, HostDriven]:
    triton, gluon = HostDriven(kernel), HostDriven(kernel, gluon=True)
    gluon.gluon.tiles = {"auto": None, "wide": linear.WIDE, "narrow": linear.NARROW}[args.tiles]
    gluon.gluon.gemv_rows = None if args.gemv_rows == "auto" else int(args.gemv_rows)
    for first, why in gluon.gluon.skipped.items():
        print(f"  left to Triton: {group_kind(kernel.manifest['events'][int(kernel.tasks[first, 3])])}: {why}")
    for first, why in gluon.gluon.one_row_skipped.items():
        print(f"  left to Triton in one-row steps: {group_kind(kernel.manifest['events'][int(kernel.tasks[first, 3])])}"
              f": {why}")
    return triton, gluon


def prompt_row(model, n: int, args) -> None:
    """A prompt of n tokens: its first step both ways, beside the persistent kernel's TTFT and torch's prefill."""
    device = torch.device("cuda")
    kernel = Megakernel.load(compile_model(model, ttft_config(n), artifact_path("ttft"), WeightsSource(seed=0)).path,
                             device="cuda", timeout_s=300)
    persistent, persistent_gpu, persistent_token = ttft_ms(kernel, n)
    prompt = seeded_prompt(n)
    triton, gluon = drivers(kernel, args)
    chained = HostDriven(kernel, gluon=True, chain=True)
    kernel.prepare([prompt], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    worst = check_groups(triton, gluon, 0)
    best: dict[str, dict[int, float]] = {}
    results = {}
    _, again, _ = timed_first_step(triton, prompt)
    for name, driver in (("triton", triton), ("gluon", gluon), ("chain", chained)):
        for _ in range(args.repeats):
            times, logits, token = timed_first_step(driver, prompt)
            best[name] = {g: min(t, best.get(name, {}).get(g, t)) for g, t in times.items()}
        results[name] = (logits, token)
    (t_logits, t_token), (g_logits, g_token), (c_logits, c_token) = (results[name] for name in
                                                                     ("triton", "gluon", "chain"))
    diff = ((g_logits - t_logits).norm() / t_logits.norm()).item()
    c_diff = ((c_logits - t_logits).norm() / t_logits.norm()).item()
    noise = ((again - t_logits).norm() / t_logits.norm()).item()
    total_t, total_g, total_c = (sum(best[name].values()) for name in ("triton", "gluon", "chain"))
    run = chained.gluon.chain_groups(kernel.last_step_size())
    in_groups, in_chain = (sum(best[name][first] for first in run) for name in ("gluon", "chain"))
    chained_host = host_to_host_ms(chained, prompt)
    lines = report(triton, best, worst)
    del kernel, triton, gluon, chained, results, t_logits, g_logits, c_logits, again
    baselines.release_memory(device)
    torch_gpu, torch_host = baselines.torch_ttft_ms(model.config, n, device)
    print(f"\nprompt {n} tokens: host-driven first step, Triton groups {total_t:.2f} ms, with the Gluon bodies "
          f"{total_g:.2f} ms ({total_t / total_g:.2f}x); persistent megakernel TTFT {persistent:.2f} ms (kernel "
          f"{persistent_gpu:.2f}); torch prefill {torch_host:.2f} ms (GPU {torch_gpu:.2f})")
    print(f"  logits with the Gluon bodies against without: rel {diff:.1e} (Triton's against another of its runs "
          f"{noise:.1e}); first token {g_token} against {t_token} (persistent {persistent_token})")
    print(f"  the Gluon bodies' {len(run)} groups as one persistent launch (codegen/gluon/chain.py): "
          f"{in_chain * 1e3:.0f} us against their {in_groups * 1e3:.0f} as group kernels "
          f"({in_groups / max(in_chain, 1e-9):.2f}x); the step {total_c:.2f} ms ("
          f"{total_t / total_c:.2f}x the Triton groups); logits against Triton's rel {c_diff:.1e}, first token "
          f"{c_token}; the first token with it host to host {chained_host:.2f} ms (persistent {persistent:.2f}, "
          f"torch {torch_host:.2f})")
    print("\n".join(lines), flush=True)


def decode_row(model, batch: int, context: int, args) -> None:
    """`batch` prompts of `context` tokens: a step that decodes them all, both ways, beside the persistent kernel's
    TPOT."""
    config = decode_config(batch, context, DECODE_STEPS)
    kernel = Megakernel.load(compile_model(model, config, artifact_path("decode"), WeightsSource(seed=0)).path,
                             device="cuda", timeout_s=300)
    persistent = tpot_ms(kernel, batch, context, DECODE_STEPS)
    triton, gluon = drivers(kernel, args)
    prompts = [torch.randint(0, 1000, (context,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(batch)]
    params = SamplingParams(max_tokens=decode_tokens(batch, context, config.max_tokens_per_step, DECODE_STEPS),
                            temperature=0, ignore_eos=True)
    step = steps_until_all_decode(triton, batch, kernel.prepare(prompts, params))
    worst = check_groups(triton, gluon, step)
    chained = HostDriven(kernel, gluon=True, chain=True)
    chained.gluon.gemv_rows = gluon.gluon.gemv_rows
    chained.gluon.one_row_chain = {"off": False, "on": True, "gemv": "gemv"}[args.one_row_chain]
    best: dict[str, dict[int, float]] = {"triton": {}, "gluon": {}, "chain": {}}
    for _ in range(args.repeats):  # the three ways on alternate steps (a context a token longer each)
        for name, driver in (("triton", triton), ("gluon", gluon), ("chain", chained)):
            step += 1
            times = timed_step(driver, step)
            best[name] = {g: min(t, best[name].get(g, t)) for g, t in times.items()}
            if kernel.last_step_size() != (batch, batch):
                raise RuntimeError(f"step {step} did not decode all {batch} sequences")
    total_t, total_g, total_c = (sum(best[name].values()) for name in ("triton", "gluon", "chain"))
    run = chained.gluon.chain_groups((batch, batch))
    in_groups, in_chain = (sum(best[name][first] for first in run) for name in ("gluon", "chain"))
    graphs = {name: graph_step_ms(driver, batch, context, GRAPH_REPLAYS) for name, driver in (("triton", triton),
                                                                                               ("chain", chained))}
    print(f"\nbatch {batch}, context {context}: host-driven decode step (launches, not a graph), Triton groups "
          f"{total_t:.2f} ms, with the Gluon bodies {total_g:.2f} ms ({total_t / total_g:.2f}x); persistent "
          f"megakernel TPOT {persistent:.2f} ms")
    if run:
        print(f"  the Gluon bodies' {len(run)} groups as one persistent launch (codegen/gluon/chain.py): "
              f"{in_chain * 1e3:.0f} us against their {in_groups * 1e3:.0f} as group kernels "
              f"({in_groups / max(in_chain, 1e-9):.2f}x); the step {total_c:.2f} ms")
    print(f"  the step's launches from one CUDA graph, replayed (median of {GRAPH_REPLAYS}): Triton groups "
          f"{graphs['triton']:.2f} ms, Gluon bodies{' with the chain' if run else ''} {graphs['chain']:.2f} ms "
          f"({persistent / graphs['chain']:.2f}x the persistent megakernel's TPOT)")
    if args.loop:
        looped = loop_tpot_ms(chained, prompts, params)
        which = "one-row loop" if batch == 1 else "batched loop"
        kernel_name = "chain.decode_chain" if batch == 1 else "batch.batch_chain"
        print(f"  the {which} (a step's plan, layers, logits and greedy tokens on the GPU, steps back to back in "
              f"one launch: `{kernel_name}` over steps): TPOT {looped:.2f} ms ({persistent / looped:.2f}x the "
              f"persistent megakernel's)")
    print("\n".join(report(triton, best, worst)), flush=True)


def host_to_host_ms(driver: HostDriven, prompt: list[int]) -> float:
    """The prompt's first token through `driver` (`HostDriven.generate`, the prompt's ids from the host and the
    token back on it), best of three after one to warm it, as `megakernel_tpot.ttft_ms` times the persistent
    kernel's."""
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    driver.generate([prompt], once)
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        driver.generate([prompt], once)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def loop_tpot_ms(driver: HostDriven, prompts: list[list[int]], params: SamplingParams) -> float:
    """The prompts' decode steps after their first through the one-row loop or the batched one
    (`HostDriven.generate(loop=True)`), the second of two generations: the median step of the whole batch from the
    loop's plans' log (`Megakernel.step_log`); `params`: enough tokens that every request decodes at once for a few
    steps, after the last prompt's prefill (`megakernel_tpot.decode_tokens`)."""
    driver.generate(prompts, params, loop=True)  # (compiles it)
    driver.generate(prompts, params, loop=True)
    return full_batch_step_ms(driver.kernel.step_log(), len(prompts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--prompts", default="512,2048", help="prompt lengths ('' for none)")
    parser.add_argument("--decode", default="", help="batch x context pairs, e.g. 64x512")
    parser.add_argument("--repeats", type=int, default=5, help="steps timed each way (the best is kept)")
    parser.add_argument("--tiles", choices=["auto", "wide", "narrow"], default="auto",
                        help="the Gluon projections' tiles: [128, 256], [128, 128], or as `linear.tiles_for` picks")
    parser.add_argument("--gemv-rows", choices=["auto"] + [str(r) for r in gemv.UNIT_ROWS], default="auto",
                        help="the one-row GEMV's units of weight rows (auto: as `gemv.rows_for` picks)")
    parser.add_argument("--one-row-chain", choices=["off", "on", "gemv"], default="on",
                        help="a one-row step's layers as one persistent launch too (`chain.decode_chain`), or its "
                             "projections' runs alone")
    parser.add_argument("--loop", action=argparse.BooleanOptionalAction, default=True,
                        help="each row's TPOT through the decode loop too (`HostDriven.generate(loop=True)`)")
    parser.add_argument("--compile-only", action="store_true", help="compile the kernels into the cache and stop")
    args = parser.parse_args()
    lengths = [int(n) for n in args.prompts.split(",") if n]
    shapes = [tuple(int(v) for v in pair.split("x")) for pair in args.decode.split(",") if pair]
    configs = [ttft_config(n) for n in lengths] + [decode_config(b, c, DECODE_STEPS) for b, c in shapes]
    seconds = compile_many([(args.preset, config) for config in configs], host_driven=configs)
    print(f"compiled {len(configs)} kernels in {seconds:.0f} s", flush=True)
    if args.compile_only:
        return
    model = resolve_model(args.preset)
    print(f"device {torch.cuda.get_device_name()}; {args.preset}, random weights; the Gluon projections' tiles "
          f"{args.tiles}, the GEMV's units {args.gemv_rows} rows; each group's launch timed by CUDA events, best of "
          f"{args.repeats}", flush=True)
    for n in lengths:
        prompt_row(model, n, args)
    for batch, context in shapes:
        decode_row(model, batch, context, args)


if __name__ == "__main__":
    main()
