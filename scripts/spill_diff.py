"""Register spills (local loads and stores) of two kept builds, by the kernel-source function they come from, where
the two differ: which bodies a change made spill. A spilled value that lives across the worker loop is reloaded
wherever it is used, so a change to a prefill body can put spills into every decode task (benchmarks/explore/
NOTES.md, session 40). Runs on the CPU machine.

    PYTHONPATH=. python scripts/kernel_resources.py qwen3-30b-a3b --set max_batch=1 --keep /tmp/a   # the base's tree
    PYTHONPATH=. python scripts/kernel_resources.py qwen3-30b-a3b --set max_batch=1 --keep /tmp/b   # the change's
    PYTHONPATH=. python scripts/spill_diff.py /tmp/a /tmp/b

A function's name is the innermost `def` above its line in that build's kernel.py, so a body that was renamed or
split shows as one function gone and another come.
"""
from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from scripts.sass_loops import instructions, source_lines

SPILL = re.compile(r"\b(LDL|STL)\b")


def spills_by_function(build: Path) -> Counter[tuple[str, str]]:
    """(function, LDL or STL) -> count, for the kept build in `build` (kernel.cubin and kernel.py)."""
    names, name = [], "?"
    for text in (build / "kernel.py").read_text().splitlines():
        if text.startswith("def "):
            name = text[4:].split("(")[0]
        names.append(name)
    lines = source_lines(build / "kernel.cubin")
    counts: Counter[tuple[str, str]] = Counter()
    for address, text in instructions(build / "kernel.cubin"):
        if m := SPILL.search(text):
            line = lines.get(address)
            counts[(names[line - 1] if line else "(Triton's library)", m.group(1))] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="a directory kernel_resources.py --keep wrote")
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = spills_by_function(args.before), spills_by_function(args.after)
    for key in sorted(set(before) | set(after)):
        if before[key] != after[key]:
            print(f"{key[0]:32s} {key[1]}  {before[key]:4d} -> {after[key]:4d}")
    print(f"{'all':32s}      {sum(before.values()):4d} -> {sum(after.values()):4d}")


if __name__ == "__main__":
    main()
