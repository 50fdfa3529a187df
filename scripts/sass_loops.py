"""The loops of a compiled kernel's SASS, with what each holds: global loads and async copies, tensor-core
instructions, and local-memory loads and stores (register spills). A loop is a backward branch and the
instructions from its target to it; innermost (shortest) loops first, only those that load global memory.
Uses the cuobjdump that Triton bundles, so it runs on the CPU machine.

    python scripts/kernel_resources.py llama3-8b --keep /tmp/k   # writes /tmp/k/kernel.cubin
    python scripts/sass_loops.py /tmp/k/kernel.cubin
"""
from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

from codegen.compile import CUOBJDUMP

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


def opcode(text: str) -> str:
    """An instruction's opcode without its modifiers or predicate: `@!P0 LDG.E.128 R4, ...` -> `LDG`."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split(" ", 1)[0].split(".", 1)[0]


def count(body: list[str], *opcodes: str) -> int:
    return sum(opcode(text) in opcodes for text in body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cubin", type=Path)
    parser.add_argument("--max-length", type=int, default=2000, help="longest loop to list, in instructions")
    args = parser.parse_args()
    code = instructions(args.cubin)
    print("instructions | address range | global loads and copies | tensor-core | local loads | local stores")
    for first, last in sorted(loops(code), key=lambda loop: loop[1] - loop[0]):
        body = [text for _, text in code[first:last + 1]]
        loads = count(body, "LDG", "LDGSTS", "UTMALDG")
        if loads and last - first < args.max_length:
            print(f"{last - first + 1} | {code[first][0]:x}-{code[last][0]:x} | {loads} | "
                  f"{count(body, 'HMMA', 'HGMMA')} | {count(body, 'LDL')} | {count(body, 'STL')}")

if __name__ == "__main__":
    main()
