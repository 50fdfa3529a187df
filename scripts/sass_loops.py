"""The loops of a compiled kernel's SASS, with what each holds: global loads and async copies, tensor-core
instructions, and local-memory loads and stores (register spills). A loop is a backward branch and the
instructions from its target to it; innermost (shortest) loops first, only those that load global memory.
Uses the cuobjdump and nvdisasm that Triton bundles, so it runs on the CPU machine.

    python scripts/kernel_resources.py llama3-8b --keep /tmp/k   # writes /tmp/k/kernel.cubin
    python scripts/sass_loops.py /tmp/k/kernel.cubin
    python scripts/sass_loops.py /tmp/k/kernel.cubin --source     # ... and each loop's source lines (kernel.py)
    python scripts/sass_loops.py /tmp/k/kernel.cubin --opcodes    # ... and each loop's instructions by opcode

`--source` names, under each loop, the lines of the kernel source beside the cubin (`--keep` writes it) that most
of the loop's instructions come from, and those of its spills: which body a loop is, and whose registers spill.
"""
from __future__ import annotations

import argparse
import re
import subprocess
from collections import Counter
from pathlib import Path

from codegen.compile import CUOBJDUMP

NVDISASM = CUOBJDUMP.parent / "nvdisasm"
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def instructions(cubin: Path) -> list[tuple[int, str]]:
    sass = subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    return [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.match, sass.splitlines()) if m]


def loops(code: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every backward branch's loop."""
    index = {address: i for i, (address, _) in enumerate(code)}
    found = []
    for i, (address, text) in enumerate(code):
        m = BRANCH.search(text)
        target = int(m.group(1), 16) if m else address
        if target < address and target in index:
            found.append((index[target], i))
    return found


def source_lines(cubin: Path) -> dict[int, int]:
    """Each instruction's line in the kernel source (`kernel.py`), from the line table ptxas keeps (`nvdisasm -g`);
    instructions that come from Triton's own library have none."""
    sass = subprocess.run([str(NVDISASM), "-g", "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    lines, line = {}, None
    for text in sass.splitlines():
        if m := LINE.search(text):
            line = int(m.group(2)) if m.group(1).endswith("kernel.py") else None
        elif (m := INSTRUCTION.match(text)) and line is not None:
            lines[int(m.group(1), 16)] = line
    return lines


def where(addresses: list[int], lines: dict[int, int], source: list[str], most: int) -> str:
    """The `most` source lines the most of `addresses` come from: 'count x line: text' each."""
    counts = Counter(lines[a] for a in addresses if a in lines)
    return "; ".join(f"{n} x {line}: {source[line - 1].strip()[:60]}" for line, n in counts.most_common(most))


def mnemonic(text: str) -> str:
    """An instruction's opcode with its modifiers, without its predicate: `@!P0 LDG.E.128 R4, ...` -> `LDG.E.128`."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split(" ", 1)[0]


def opcode(text: str) -> str:
    """An instruction's opcode without its modifiers or predicate: `@!P0 LDG.E.128 R4, ...` -> `LDG`."""
    return mnemonic(text).split(".", 1)[0]


def count(body: list[str], *opcodes: str) -> int:
    return sum(opcode(text) in opcodes for text in body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--max-length", type=int, default=2000, help="longest loop to list, in instructions")
    parser.add_argument("--source", action="store_true", help="each loop's lines of the kernel.py beside the cubin")
    parser.add_argument("--opcodes", action="store_true",
                        help="each loop's instructions by opcode and modifiers, most first (e.g. IMAD.WIDE against "
                             "IMAD.WIDE.U32: signed and unsigned address arithmetic)")
    args = parser.parse_args()
    code = instructions(args.cubin)
    if args.source:
        lines = source_lines(args.cubin)
        source = (args.cubin.parent / "kernel.py").read_text().splitlines()
    print("instructions | address range | global loads and copies | tensor-core | local loads | local stores")
    for first, last in sorted(loops(code), key=lambda loop: loop[1] - loop[0]):
        body = [text for _, text in code[first:last + 1]]
        loads = count(body, "LDG", "LDGSTS", "UTMALDG")
        if loads and last - first < args.max_length:
            print(f"{last - first + 1} | {code[first][0]:x}-{code[last][0]:x} | {loads} | "
                  f"{count(body, 'HMMA', 'HGMMA')} | {count(body, 'LDL')} | {count(body, 'STL')}")
            if args.source:
                addresses = [address for address, _ in code[first:last + 1]]
                print(f"    lines: {where(addresses, lines, source, 3)}")
                spills = [address for address, text in code[first:last + 1] if opcode(text) in ("LDL", "STL")]
                if spills:
                    print(f"    spills: {where(spills, lines, source, 3) or 'in Triton library code'}")
            if args.opcodes:
                ops = Counter(map(mnemonic, body))
                print("    opcodes: " + ", ".join(f"{n} {op}" for op, n in ops.most_common()))

if __name__ == "__main__":
    main()
