"""Where the one-row chain (`codegen/gluon/chain.py`, `decode_chain`) stops: a decode step of one row through it with
its programs stamping where they are (`chain._stamp`), read back while it runs.

The decode benchmark's kernel (`megakernel_tpot.decode_config(1, context)`) prefills a prompt with the Triton group
kernels, then launches one decode step's groups up to the chain and the chain (`--mode gemv`: its projections' runs
alone, `on`: with split attention), or (`--mode loop`) the loop over `--steps` steps, each planned and sampled in it.
If the launch has not finished after `--wait` seconds, the chain's counters and stamps are copied out on a
second stream (a copy engine reads them while the SMs spin) and summarised: how many programs signalled each group,
and where the others' loader and consumers are (group, stage, ring slots issued or consumed). The process then exits
without waiting for the GPU.

    python -m benchmarks.explore.chain_probe --mode gemv      # on an H100 / H200, under a timeout
    python -m benchmarks.explore.chain_probe --mode loop --steps 8   # the loop over steps (`HostDriven.run_loop`)
    python -m benchmarks.explore.chain_probe --mode on --batch 64     # a batched decode step (`batch.batch_chain`)
"""
from __future__ import annotations

import argparse
import ctypes
import os
import time
from collections import Counter

import torch

from benchmarks.decode import steps_until_all_decode
from benchmarks.gluon_groups import DECODE_STEPS
from benchmarks.megakernel_tpot import artifact_path, decode_config, decode_tokens, full_batch_step_ms
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.gluon import chain
from models.registry import resolve_model
from runtime.host_driven import HostDriven
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams

LOADER_STAGES = {0: "started", 1: "past _released", 2: "descriptors made", 3: "early weights issued",
                 4: "past the event", 6: "every slot issued"}
CONSUMER_STAGES = {1: "started", 2: "units done", 3: "signalled"}


def occupancy(kernel) -> str:
    """The compiled chain's registers, shared memory and how many of its programs an SM holds (the driver's
    `cuOccupancyMaxActiveBlocksPerMultiprocessor`)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    blocks = ctypes.c_int(0)
    threads = kernel.metadata.num_warps * 32
    rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(kernel.function),
                                                          threads, ctypes.c_size_t(kernel.metadata.shared))
    return (f"{kernel.n_regs} registers, {kernel.n_spills} spills, {kernel.metadata.shared} B shared, "
            f"{kernel.metadata.num_warps} warps; {blocks.value if rc == 0 else f'(cuda error {rc})'} programs an SM")


def summary(words: torch.Tensor, groups: int, programs: int, stamped: bool = True) -> None:
    """The counters and (`stamped`: the one-row chain's, `chain._stamp`) the stamps of a chain of `groups` groups on
    `programs` programs."""
    counts = words[:groups].tolist()
    short = [g for g, count in enumerate(counts) if count != programs]
    if short:
        print(f"  signalled, by group: every program the first {short[0]}, then {counts[short[0]:short[0] + 16]}")
    else:
        print(f"  every group signalled by all {programs} programs")
    if not stamped:  # (`batch.batch_chain` keeps clocks, not stamps)
        return
    stamps = words[groups:groups + 8 * programs].view(programs, 8)
    loader = Counter((int(g) - 1, LOADER_STAGES.get(int(s), s)) for g, s in stamps[:, :2].tolist())
    consumer = Counter((int(g) - 1, CONSUMER_STAGES.get(int(s), s)) for g, s in stamps[:, 4:6].tolist())
    print("  loaders (group, stage): programs:", dict(sorted(loader.items(), key=str)))
    print("  consumers (group, stage): programs:", dict(sorted(consumer.items(), key=str)))
    behind = [p for p in range(programs) if stamps[p, 5] != 3 or stamps[p, 4] != groups]
    for p in behind[:12]:
        s = stamps[p].tolist()
        print(f"  program {p} (SM pair {p % (programs // 2)}): loader group {s[0] - 1} stage {s[1]} slots {s[2]}; "
              f"consumers group {s[4] - 1} stage {s[5]} slots {s[6]}")
    print(f"  {len(behind)} of {programs} programs not done", flush=True)


def names(kinds: list[int]) -> list[str]:
    """The table's groups by what they are: a plain projection after attention is o_proj, else down."""
    code = {chain.QKV: "qkv", chain.ATTENTION: "attention", chain.GATED: "gate/up", chain.LOGITS: "lm_head",
            chain.EMBED: "embedding", chain.GATHER: "gather", chain.SAMPLE: "sample", chain.PLAN: "plan"}
    return [code.get(k, "o_proj" if g and kinds[g - 1] == chain.ATTENTION else "down") for g, k in enumerate(kinds)]


def timeline(words: torch.Tensor, kinds: list[int], programs: int) -> None:
    """Where a traced chain's time went (`chain._clock`'s times, us): each kind of group from the event before it to
    its own (the last program's signal), summed over the chain; how long the loaders took to see the event before,
    and how far the last program's signal came after the median one's (attention's loaders stamp their start: their
    items' older keys go in before the event; a step's rows have no loader's stamp: "-", and a loop's first plan no
    time of its own); and where a batched chain's narrow groups stamp them (QKV, o_proj, gate/up, down), when their
    consumers saw the event before, when their (last tile's) products were done, and how long each program's epilogue
    took after them (medians over programs)."""
    groups = len(kinds)
    raw = words[groups + 8 * programs:].view(programs, groups, chain.CLOCKS.value).long()
    # (the timer's low 32 bits: ns, wrapping every 4.3 s; signed from program 0's first signal; 0: not stamped)
    t = (((raw - raw[0, 0, 1] + (1 << 31)) % (1 << 32)) - (1 << 31)).double() / 1e3
    t[raw == 0] = float("nan")
    done = t[:, :, 1].max(dim=0).values
    loaded = t[:, 0, 0][~t[:, 0, 0].isnan()]
    start = loaded.min() if loaded.numel() else done[0]
    ran: dict[str, list[float]] = {}
    seen: dict[str, list[float]] = {}
    late: dict[str, list[float]] = {}
    parts: dict[str, list[list[float]]] = {}  # (consumers past the event, products done, epilogue)
    for g, name in enumerate(names(kinds)):
        before = done[g - 1] if g else start
        ran.setdefault(name, []).append((done[g] - before).item())
        seen.setdefault(name, []).append((t[:, g, 0] - before).nanmedian().item() if g else 0.0)
        late.setdefault(name, []).append((done[g] - t[:, g, 1].median()).item())
        if g and not t[:, g, 3].isnan().all():
            parts.setdefault(name, []).append([(t[:, g, 2] - before).nanmedian().item(),
                                               (t[:, g, 3] - before).nanmedian().item(),
                                               (t[:, g, 1] - t[:, g, 3]).nanmedian().item()])
    print(f"  the chain's timeline ({groups} groups, {done[-1] - start:.0f} us from the first loader to the last "
          f"signal; us, summed over the chain, and medians a group):")
    for name in ran:
        r, s_, l_ = (torch.tensor(v) for v in (ran[name], seen[name], late[name]))
        loaders = "    -" if s_.isnan().all() else f"{s_.nanmedian():5.2f}"
        print(f"    {name:9s} {r.sum():7.0f} us, {r.median():6.1f} a group; the loaders past the event before "
              f"{loaders}; the last signal past the median {l_.median():5.1f}", flush=True)
        if name in parts:
            seen_, products, epilogue = torch.tensor(parts[name]).median(dim=0).values.tolist()
            print(f"    {'':9s} the consumers past the event before {seen_:5.2f}, their products done {products:5.1f}, "
                  f"the epilogue {epilogue:4.1f} (a program's, medians)", flush=True)


def timed(chained: HostDriven, table: torch.Tensor, repeats: int, batched: bool = False) -> None:
    """The chain alone, launched again on the step's arenas (its outputs rewritten: only the time matters here),
    traced and not, each the best of `repeats` by CUDA events."""
    g = chained.gluon
    best = {}
    for tracing in (False, True):
        g.tracing = tracing
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(50_000_000)  # (the launch queued before the GPU gets to it)
            start.record()
            g._launch_chain(table, not batched, batched=batched)
            end.record()
            end.synchronize()
            best[tracing] = min(best.get(tracing, 1e9), start.elapsed_time(end))
    print(f"  the chain alone: {best[False] * 1e3:.0f} us, traced {best[True] * 1e3:.0f} (best of {repeats})",
          flush=True)


def sustained(chained: HostDriven, table: torch.Tensor, launches: int, batched: bool, label: str) -> None:
    """The chain launched `launches` times back to back (no idle GPU between them, as in a served batch's steps):
    the mean launch of the first and the last tenth, untraced. A GPU that slows under sustained load (its clocks
    capped by power or heat) shows the last tenth slower than the first."""
    g = chained.gluon
    g.tracing = False
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(launches + 1)]
    torch.cuda.synchronize()
    marks[0].record()
    for n in range(launches):
        g._launch_chain(table, not batched, batched=batched)
        marks[n + 1].record()
    marks[-1].synchronize()
    times = [marks[n].elapsed_time(marks[n + 1]) * 1e3 for n in range(launches)]
    tenth = max(launches // 10, 1)
    print(f"  {label}: {launches} launches back to back, {sum(times) / launches:.0f} us a launch; the first tenth "
          f"{sum(times[:tenth]) / tenth:.0f}, the last {sum(times[-tenth:]) / tenth:.0f} (ended at "
          f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d})", flush=True)


def traced(chained: HostDriven, table: torch.Tensor, batched: bool, kinds: list[int], programs: int,
           words: int) -> None:
    """The chain launched once more, traced, and where its time went (`timeline`)."""
    g = chained.gluon
    g.tracing = True
    g._launch_chain(table, not batched, batched=batched)
    torch.cuda.synchronize()
    timeline(g.counters[:words].cpu(), kinds, programs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--mode", choices=["gemv", "on", "loop"], default="gemv",
                        help="the chain's projections alone, the one-row chain, or the loop over steps")
    parser.add_argument("--steps", type=int, default=8, help="--mode loop: the steps launched")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding: more than one, the batched chain "
                        "and loop (`batch.batch_chain`)")
    parser.add_argument("--rows", type=int, default=None, help="the GEMV's unit rows (the executor's if not given)")
    parser.add_argument("--split-slots", default="", help="attention's least slots of keys a split, e.g. 1,4,8: the "
                        "chain timed with each after the first (the executor's)")
    parser.add_argument("--probes", default="", help="with --batch: the chain timed again with each of these "
                        "timing-only PROBE values of `batch.batch_chain` (1: no rows copied, 2: no partials "
                        "exchanged, 3: both, 4: no products, 8: the weights read as if tiled, 16: no projection "
                        "waits for the group before, 18: nor a fragment for its tile's, 32: attention without "
                        "products, 64: the cache read as if a page's KV heads were contiguous), e.g. 1,2,3,4")
    parser.add_argument("--tiles", default="", help="with --batch: the chain timed again with a layer's groups' "
                        "third column of the table (0: stream-K, 1: whole-K narrow tiles, 2: QKV's pair tiles, 3: "
                        "gate/up's narrow tiles four at a time; `GluonCoverage.batch_narrow`)"
                        " set to each of these, e.g. 1,0,1,0,1/0,0,0,0,0 (QKV, attention, o_proj, gate/up, down)")
    parser.add_argument("--sustained", type=int, default=0, help="with --batch: then the chain launched this many "
                        "times back to back, untraced, main and each of --probes and --tiles (clocks under sustained "
                        "load)")
    parser.add_argument("--wait", type=float, default=15.0, help="seconds before the step counts as stuck")
    parser.add_argument("--repeats", type=int, default=10, help="the chain's launches timed each way (best kept)")
    args = parser.parse_args()
    model = resolve_model(args.preset)
    batch, batched = args.batch, args.batch > 1
    config = decode_config(batch, args.context, DECODE_STEPS)
    compile_many([(args.preset, config)], host_driven=[config])  # (the cache's, with its host-driven kernels)
    kernel = Megakernel.load(compile_model(model, config, artifact_path("decode"), WeightsSource(seed=0)).path,
                             device="cuda", timeout_s=300)
    triton = HostDriven(kernel)
    prompts = [torch.randint(0, 1000, (args.context,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(batch)]
    params = SamplingParams(max_tokens=decode_tokens(batch, args.context, config.max_tokens_per_step, DECODE_STEPS),
                            temperature=0, ignore_eos=True)
    step = steps_until_all_decode(triton, batch, kernel.prepare(prompts, params))
    chained = HostDriven(kernel, gluon=True, chain=True)
    g = chained.gluon
    g.one_row_chain, g.gemv_rows, g.tracing = {"gemv": "gemv", "on": True, "loop": True}[args.mode], args.rows, True
    run = g.chain_groups((batch, batch))
    if args.mode == "loop":  # the table over steps: an event a group a step
        rows, why = g.loop_rows(batched)
        if why:
            raise SystemExit(f"the loop cannot run this kernel: {why}")
        kinds = [kind for kind, _, _ in rows] * args.steps
    else:
        table = g._chain_for((batch, batch))[2]
        kinds = table.view(-1, chain.ROW)[:, 0].tolist()
    groups, programs = len(kinds), g.loop_programs(batched)
    print(f"device {torch.cuda.get_device_name()}; {args.preset}, {batch} rows at context {args.context}; the chain "
          f"({args.mode}): {groups} groups, kinds {kinds[:len(kinds) // (args.steps if args.mode == 'loop' else 1)]}, "
          f"{programs} programs", flush=True)
    side = torch.cuda.Stream()  # (made before the chain runs: a host call that waits for the GPU would hang here)
    words = groups + 8 * programs + chain.CLOCKS.value * programs * groups  # (`chain._stamp`'s, `chain._clock`'s)
    host = torch.empty(words, dtype=torch.int32, pin_memory=True)
    torch.cuda.synchronize()
    if args.mode == "loop":  # (its first step planned in it)
        g.launch_loop(step, args.steps, batched=batched)
    else:
        step += 1
        size = chained.plan_step(step) or kernel.last_step_size()
        for first, count in chained.groups:  # the step's groups up to the chain's launch, and no further
            chained.launch_group(first, count, step, size)
            if first == run[0]:
                break
            if first == chained.groups[0][0]:
                print("  the step's first group launched", flush=True)
    done = torch.cuda.Event()
    done.record()
    compiled = [k for cache in chain.decode_chain.device_caches.values() for k in cache[0].values()]
    for k in compiled:
        print("  compiled:", occupancy(k), flush=True)
    start = time.time()
    while not done.query() and time.time() - start < args.wait:
        time.sleep(0.1)
    if done.query():
        print(f"  the chain finished within {time.time() - start:.2f} s of waiting", flush=True)
        summary(g.counters[:words].cpu(), groups, programs, stamped=not batched)
        timeline(g.counters[:words].cpu(), kinds, programs)
        if args.mode == "loop":
            log = kernel.step_log()
            print(f"  the loop's steps (tokens, sequences) {[entry[1:] for entry in log]}; the median step "
                  f"{full_batch_step_ms(log, batch):.3f} ms; tokens so far {kernel.completions(1)[0].tokens}",
                  flush=True)
            return
        timed(chained, table, args.repeats, batched)
        for probe in [int(v) for v in args.probes.split(",") if v]:
            g.batch_probe = probe
            print(f"  PROBE {probe} (timing only):", flush=True)
            timed(chained, table, args.repeats, batched)
            traced(chained, table, batched, kinds, programs, words)  # (where each kind of group's time went)
        g.batch_probe = 0
        if args.sustained:
            for probe in [0] + [int(v) for v in args.probes.split(",") if v]:
                g.batch_probe = probe
                sustained(chained, table, args.sustained, batched, f"PROBE {probe}")
            g.batch_probe = 0
        for pattern in [v for v in args.tiles.split("/") if v]:
            print(f"  a layer's tiles {pattern}:", flush=True)
            changed = table.clone().view(-1, chain.ROW)
            layer = [int(v) for v in pattern.split(",")]
            first = kinds.index(chain.QKV)
            for g_at in range(first, first + (len(kinds) - first) // len(layer) * len(layer)):
                changed[g_at, 2] = layer[(g_at - first) % len(layer)]
            changed = changed.flatten()
            timed(chained, changed, args.repeats, batched)
            traced(chained, changed, batched, kinds, programs, words)
            if args.sustained:  # (main's again first: a GPU's clocks drift as it warms)
                sustained(chained, table, args.sustained, batched, "main")
                sustained(chained, changed, args.sustained, batched, f"tiles {pattern}")
        for slots in [int(v) for v in args.split_slots.split(",") if v]:
            g.split_slots = slots
            print(f"  attention's splits of {slots} slots of keys at least:", flush=True)
            traced(chained, table, batched, kinds, programs, words)
            timed(chained, table, args.repeats)
        return
    print(f"  the chain has not finished after {args.wait:.0f} s; its stamps:", flush=True)
    with torch.cuda.stream(side):
        host.copy_(g.counters[:words], non_blocking=True)
    side.synchronize()
    summary(host, groups, programs, stamped=not batched)
    os._exit(3)


if __name__ == "__main__":
    main()
