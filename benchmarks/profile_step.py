"""Where a step's time goes inside the megakernel: each task's start, end of its waits and end (global
timer, compiled with `profile`), summed per group and per task kind. The first decode step by default,
`--prefill` the step that prefills the whole batch's prompts. GPU only."""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch

from benchmarks.megakernel_tpot import artifact_path, decode_tokens, parse_field, prefill_budget, tpot_ms
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.config import CompileConfig
from codegen.tasks import Kind
from models.registry import resolve_model
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


def summarize(kernel: Megakernel) -> list[str]:
    times = kernel.task_profile()
    tasks = kernel.tasks.cpu()
    ran = times[:, 0] > 0
    t0, t_end = int(times[ran, 0].min()), int(times[ran, 2].max())
    groups: dict[int, list[int]] = defaultdict(list)
    for index in torch.nonzero(ran).flatten().tolist():
        groups[int(tasks[index, 3])].append(index)
    kinds = defaultdict(lambda: [0, 0, 0])  # busy ns, waiting ns, tasks
    lines = [f"step span {(t_end - t0) / 1e3:.1f} us over {int(ran.sum())} tasks"]
    rows, last_end = [], t0
    for event, members in sorted(groups.items()):
        t = times[members]
        busy, waiting = int((t[:, 2] - t[:, 1]).sum()), int((t[:, 1] - t[:, 0]).sum())
        kind = Kind(int(tasks[members[0], 0])).name
        kinds[kind][0] += busy
        kinds[kind][1] += waiting
        kinds[kind][2] += len(members)
        # each program's last end in the group: how far the slowest program trails the median one
        ends: dict[int, int] = {}
        for program, end in zip(t[:, 3].tolist(), t[:, 2].tolist()):
            ends[program] = max(ends.get(program, 0), int(end))
        finish = sorted(ends.values())
        end = int(t[:, 2].max())
        rows.append((kernel.manifest["events"][event], len(members), (int(t[:, 0].min()) - t0) / 1e3,
                     (end - int(t[:, 0].min())) / 1e3, busy / len(members) / 1e3,
                     int((t[:, 2] - t[:, 1]).max()) / 1e3, (int(t[:, 1].min()) - last_end) / 1e3,
                     (end - last_end) / 1e3, (end - finish[len(finish) // 2]) / 1e3))
        last_end = end
    lines.append("group | tasks | starts at us | span us | mean busy us | max busy us | first wait done us after "
                 "the group before | critical us | tail us (last end - median program's)")
    lines += ["{} | {} | {:.1f} | {:.1f} | {:.2f} | {:.2f} | {:.1f} | {:.1f} | {:.1f}".format(*row)
              for row in rows[:24] + rows[-4:]]
    lines.append("kind | tasks | busy ms (summed over programs) | waiting ms (summed)")
    by_busy = sorted(kinds.items(), key=lambda item: -item[1][0])
    lines += [f"{k} | {n} | {b / 1e6:.2f} | {w / 1e6:.2f}" for k, (b, w, n) in by_busy]
    return lines


def profile_config(batch: int, context: int, prefill: bool, **fields) -> CompileConfig:
    """A profiling build for `batch` prompts of `context` tokens: it records the step that prefills them
    all (`prefill`) or a decode step well after the prefill (sequences that finish their prefill early
    decode beside the others' chunks, so the first steps after it are mixed). `fields` may replace any of the
    budget's fields (`max_tokens_per_step=2048,max_batch=8`: the prompts in the CLI's default kernel)."""
    prompt_tokens = batch * context
    per_step = fields.pop("max_tokens_per_step", prompt_tokens if prefill else prefill_budget(batch, context))
    new_tokens = decode_tokens(batch, context, per_step, 16)
    return CompileConfig(**{**dict(max_batch=batch, max_tokens_per_step=per_step,
                                   max_model_len=context + new_tokens + 8, max_new_tokens=new_tokens),
                            **fields, "profile": True,
                            "profile_step": 0 if prefill else -(-prompt_tokens // per_step) + 8})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--context", default="512", help="context (prompt) lengths, comma-separated")
    parser.add_argument("--batch", default="1", help="batch sizes, comma-separated: one profile each")
    parser.add_argument("--prefill", action="store_true", help="profile the step that prefills every prompt")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a CompileConfig field of the profiled kernels (repeatable), e.g. --set batch_n=64")
    parser.add_argument("--dump", help="also save each profile's raw per-task times to DUMP-b{batch}-c{context}.pt")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the profiling kernels into the cache (BLINK_CACHE_DIR) and stop, as "
                             "`megakernel_tpot --compile-only` does")
    args = parser.parse_args()
    shapes = [(int(b), int(c)) for b in args.batch.split(",") for c in args.context.split(",")]
    fields = {key: parse_field(value) for key, value in (item.split("=", 1) for item in args.set)}
    configs = [profile_config(batch, context, args.prefill, **fields) for batch, context in shapes]
    compile_many([(args.preset, config) for config in configs])
    if args.compile_only:
        return
    for (batch, context), config in zip(shapes, configs):
        path = compile_model(resolve_model(args.preset), config, artifact_path("profile"), WeightsSource(seed=0)).path
        kernel = Megakernel.load(path, device="cuda", timeout_s=120)
        print(f"== {args.preset} batch {batch} context {context}: "
              f"TPOT {tpot_ms(kernel, batch, context, 16):.2f} ms (profiling build)")
        kernel.generate([torch.randint(0, 1000, (context,)).tolist() for _ in range(batch)],
                        SamplingParams(max_tokens=config.max_new_tokens, temperature=0, ignore_eos=True))
        print("\n".join(summarize(kernel)), flush=True)
        if args.dump:
            torch.save({"times": kernel.task_profile(), "tasks": kernel.tasks.cpu()[:, :4].int(),  # kind .. signal
                        "events": kernel.manifest["events"], "programs": kernel.kernel.grid[0]},
                       f"{args.dump}-b{batch}-c{context}.pt")
        del kernel
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
