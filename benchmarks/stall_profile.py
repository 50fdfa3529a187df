"""Why the megakernel's warps stall, line by line of the task bodies: Nsight Compute samples each warp's
program counter every 2^(5+k) cycles with the reason it could not issue; summed per line of the rendered
kernel (Triton keeps its file and line in the cubin), that says which loop waits on what (long scoreboard: a
global load; barrier: a CTA sync; wait / short scoreboard: a fixed latency or shared memory...). GPU only.
Three steps, so that ncu wraps the launch alone (`bash scripts/gpu_check.sh stalls` runs them):

    python -m benchmarks.stall_profile compile 64x512 ttft512
    ncu --metrics group:smsp__pcsamp_warp_stall_reasons -k regex:blink_megakernel --launch-skip 1 \\
        --launch-count 1 -o /tmp/b64 python -m benchmarks.stall_profile launch 64x512 --source-out /tmp/b64.py
    python -m benchmarks.stall_profile summarize /tmp/b64.ncu-rep --tsv /tmp/b64.tsv --source /tmp/b64.py

`launch` runs the variant twice (the first launch warms up, ncu skips it). A decode variant's launch also
prefills its prompts: `--tokens` decode steps make most of the samples."""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path

REASON_PREFIX = "smsp__pcsamp_warps_issue_stalled_"


def compile_variants(specs: list[str], preset: str, tokens: int) -> None:
    from benchmarks.megakernel_tpot import Variant
    from blinkc.compile_model import compile_many
    seconds = compile_many([(preset, Variant.parse(spec).config(tokens)) for spec in specs])
    print(f"compiled {len(specs)} kernels side by side in {seconds:.0f} s", flush=True)


def launch(spec: str, preset: str, tokens: int, source_out: str | None) -> None:
    import torch

    from benchmarks.megakernel_tpot import Variant, artifact_path, decode_tokens
    from blinkc.compile_model import WeightsSource, compile_model
    from models.registry import resolve_model
    from runtime.megakernel import Megakernel
    from runtime.sampling import SamplingParams
    variant = Variant.parse(spec)
    config = variant.config(tokens)
    path = compile_model(resolve_model(preset), config, artifact_path("stalls"), WeightsSource(seed=0)).path
    if source_out:  # the rendered kernel, whose lines the samples name
        shutil.copyfile(path.with_name(path.name + ".py"), source_out)
    kernel = Megakernel.load(path, device="cuda", timeout_s=600)
    prompts = [torch.randint(0, 1000, (variant.context,)).tolist() for _ in range(variant.batch)]
    max_tokens = 1 if variant.is_ttft else decode_tokens(variant.batch, variant.context,
                                                         config.max_tokens_per_step, tokens)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for _ in range(2):  # ncu skips the first launch
        kernel.generate(prompts, params)
    print(f"{preset} {spec}: two launches of {max_tokens} tokens each", flush=True)


def ncu_report_module():
    """Nsight Compute's own Python reader of its reports (extras/python in its install)."""
    ncu = shutil.which("ncu")
    roots = [str(Path(ncu).resolve().parent)] if ncu else []
    roots += glob.glob("/opt/nvidia/nsight-compute/*") + glob.glob("/usr/local/cuda*/nsight-compute*")
    for root in roots:
        for found in glob.glob(os.path.join(root, "**", "ncu_report.py"), recursive=True):
            sys.path.insert(0, os.path.dirname(found))
            import ncu_report
            return ncu_report
    raise SystemExit(f"no ncu_report.py under {roots}")


def summarize(report: str, tsv: str | None, top: int, source: str | None) -> None:
    ncu_report = ncu_report_module()
    action = ncu_report.load_report(report).range_by_idx(0).action_by_idx(0)
    group = action.metric_by_name("group:smsp__pcsamp_warp_stall_reasons")
    if group is None:
        raise SystemExit("the report has no warp-state samples (group:smsp__pcsamp_warp_stall_reasons)")
    samples: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # pc -> reason -> samples
    for name in filter(None, (n.strip() for n in group.value().split(","))):
        metric = action[name]
        if metric.num_instances() == 0 or not metric.has_correlation_ids():
            continue
        pcs = metric.correlation_ids()
        reason = name.removeprefix(REASON_PREFIX)
        for i in range(metric.num_instances()):
            value = metric.value(i)
            if value:
                samples[int(pcs.value(i))][reason] += value
    where = {}
    for pc in samples:
        info = action.source_info(pc)
        where[pc] = (os.path.basename(info.file_name()) if info else "?", info.line() if info else 0)
    codes = {}  # a file's lines: the rendered kernel's (`source`), or a Gluon kernel's own module (codegen/gluon)
    for file in {file for file, _ in where.values()}:
        found = Path(source) if source else Path(__file__).parents[1] / "codegen" / "gluon" / file
        codes[file] = found.read_text().splitlines() if found.is_file() else []

    def line_of(pc: int) -> str:
        file, line = where[pc]
        code = codes.get(file, [])
        text = code[line - 1].strip() if 0 < line <= len(code) else ""
        return f"{file}:{line} {text}".rstrip()

    print(f"{report}: {sum(sum(r.values()) for r in samples.values()):.0f} samples at {len(samples)} instructions")
    for title, key in (("by file", lambda pc: where[pc][0]), ("by source line", line_of),
                       ("by instruction", lambda pc: f"{pc:#07x} {line_of(pc)} | {action.sass_by_pc(pc)}")):
        print(f"\n== {title} (share of all samples; the three largest reasons)")
        print("\n".join(share_table(samples, key, top)))
    if tsv:
        reasons = sorted({r for rs in samples.values() for r in rs})
        with open(tsv, "w") as out:
            out.write("\t".join(["pc", "file", "line", "sass", *reasons]) + "\n")
            for pc in sorted(samples):
                out.write("\t".join([f"{pc:#x}", *map(str, where[pc]), action.sass_by_pc(pc) or "",
                                     *(f"{samples[pc].get(r, 0):.0f}" for r in reasons)]) + "\n")


def share_table(samples: dict[int, dict[str, float]], key, top: int) -> list[str]:
    """The `top` largest groups of instructions (`key(pc)` names an instruction's group) by their share of all
    samples, each with its three largest stall reasons."""
    total = sum(sum(reasons.values()) for reasons in samples.values())
    groups: dict = defaultdict(lambda: defaultdict(float))
    for pc, reasons in samples.items():
        for reason, value in reasons.items():
            groups[key(pc)][reason] += value
    rows = []
    for name, reasons in sorted(groups.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        count = sum(reasons.values())
        largest = ", ".join(f"{r} {v / count:.0%}" for r, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
        rows.append(f"{count / total:6.1%}  {name}: {largest}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["compile", "launch", "summarize"])
    parser.add_argument("targets", nargs="+", help="variants (compile, launch: one) or a report (summarize)")
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--tokens", type=int, default=256, help="decode steps of the whole batch")
    parser.add_argument("--tsv", help="summarize: also write every sampled instruction's counts here")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--source-out", help="launch: also copy the rendered kernel source here")
    parser.add_argument("--source", help="summarize: the rendered kernel source, to print each line's code (without "
                        "it, a Gluon kernel's lines are its modules' under codegen/gluon)")
    args = parser.parse_args()
    if args.command == "compile":
        compile_variants(args.targets, args.preset, args.tokens)
    elif args.command == "launch":
        launch(args.targets[0], args.preset, args.tokens, args.source_out)
    else:
        summarize(args.targets[0], args.tsv, args.top, args.source)


if __name__ == "__main__":
    main()
