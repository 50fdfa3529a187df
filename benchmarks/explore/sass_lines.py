"""A compiled kernel's SASS counted by source line: instructions and spill traffic (STL/LDL) a line of one source
file, from the cubin's line table (`nvdisasm --print-line-info`, Triton's own copy). Two cubins side by side show
where their code differs: session 76's PROBE 128 kernel made attention 2-2.5 us a layer faster with no change to
attention's code, and its lines' instructions were scheduled differently.

    python -m benchmarks.explore.sass_lines KERNEL.cubin [OTHER.cubin] --file attention.py --lines 470-505
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import triton

NVDISASM = Path(os.path.dirname(triton.__file__)) / "backends" / "nvidia" / "bin" / "nvdisasm"
LINE = re.compile(r'## File "([^"]+)", line (\d+)')
OFFSET = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)")
SPILL = re.compile(r"\b(STL|LDL)\b")


def line_table(cubin: Path) -> dict[int, tuple[str, int, str]]:
    """Each instruction of the cubin's SASS (its kernel's .text section: a Triton kernel is one function) by its
    offset: (source file's name, line, the instruction)."""
    listing = subprocess.run([str(NVDISASM), "--print-line-info", str(cubin)], capture_output=True, text=True,
                             check=True).stdout
    where, code, table = None, False, {}
    for text in listing.splitlines():
        if text.split()[:1] == [".section"]:
            code = text.split()[1].startswith(".text")
        elif found := LINE.search(text):
            where = (Path(found.group(1)).name, int(found.group(2)))
        elif code and where and (found := OFFSET.match(text)):
            table[int(found.group(1), 16)] = (*where, found.group(2).strip())
    return table


def by_line(cubin: Path, source: str) -> tuple[Counter, Counter]:
    """Instructions and spill instructions a line of `source` (a file name) in the cubin's SASS."""
    instructions, spills = Counter(), Counter()
    for name, line, text in line_table(cubin).values():
        if name == source:
            instructions[line] += 1
            spills[line] += bool(SPILL.search(text))
    return instructions, spills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cubins", type=Path, nargs="+", help="one kernel, or two to compare")
    parser.add_argument("--file", default="attention.py", help="the source file's name")
    parser.add_argument("--lines", default="1-100000", help="first-last line")
    args = parser.parse_args()
    first, last = (int(v) for v in args.lines.split("-"))
    counted = [by_line(cubin, args.file) for cubin in args.cubins]
    lines = sorted({n for instructions, _ in counted for n in instructions if first <= n <= last})
    print(f"{args.file} line: " + " | ".join(f"instructions, spills ({c.parent.name})" for c in args.cubins))
    for n in lines:
        print(f"{n:5d}: " + " | ".join(f"{ins[n]:4d} {sp[n]:3d}" for ins, sp in counted))
    print("total: " + " | ".join(f"{sum(ins[n] for n in lines)} {sum(sp[n] for n in lines)}" for ins, sp in counted))


if __name__ == "__main__":
    main()
