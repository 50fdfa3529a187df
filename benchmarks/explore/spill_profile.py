"""Which spill instructions a kernel runs, how often, and how long the instructions that read their values wait:
ncu's per-instruction counters (the SourceCounters section, exported as CSV) over the cubin's line table
(`sass_lines.line_table`), summed by source line.

A spill's cost is not on its own instruction: a local load (LDL) issues and the warp goes on until an instruction
reads the register it loads, which then waits on the long scoreboard. So each LDL's wait is read off the first
instruction after it that names its register among its operands (within WINDOW instructions, before any instruction
writes that register first; a listing's order, not the branches'). Session 77 found this way that the batched chain's
loader warp, at 40 registers, ran 139 of the kernel's 311 spill instructions (`batch.LOADER_REGS`).

    bash scripts/gpu_check.sh b64-spills          # on the GPU: $OUT/b64-spills.csv.gz
    python -m benchmarks.explore.spill_profile b64-spills.csv.gz KERNEL.cubin
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import re
from collections import Counter
from pathlib import Path

WINDOW = 40
LOCAL_LOAD = re.compile(r"\bLDL(?:\.\w+)*\s+R(\d+)")
SPILL = re.compile(r"\b(LDL|STL)\b")
REGISTER = re.compile(r"\bR(\d+)\b")
NO_DESTINATION = re.compile(r"^(ST|RED|BAR|BRA|BRX|EXIT|RET|CALL|WARPSYNC|MEMBAR|FENCE|ARRIVES|SYNCS\.ARRIVE)")


def read_rows(path: Path) -> list[dict]:
    """ncu's `--page source --csv --print-source sass` export (gzipped or not): one dict a SASS instruction."""
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith('"Address"'))  # (after the kernel's name)
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def _operands(instruction: str) -> tuple[set[int], set[int]]:
    """(registers written, registers read) of one SASS instruction, from its text: the first operand is written
    unless the opcode writes none (stores, reductions, branches, barriers); a .64 load writes a register pair."""
    body = re.sub(r"^@!?U?P\w+\s+", "", instruction.strip().rstrip(";").strip())
    opcode, _, rest = body.partition(" ")
    operands = [part.strip() for part in rest.split(",")] if rest else []
    if not operands or NO_DESTINATION.match(opcode):
        return set(), {int(r) for part in operands for r in REGISTER.findall(part)}
    written = {int(r) for r in REGISTER.findall(operands[0])}
    if written and (".64" in opcode or ".128" in opcode):
        first = min(written)
        written |= set(range(first, first + (2 if ".64" in opcode else 4)))
    return written, {int(r) for part in operands[1:] for r in REGISTER.findall(part)}


def profile(rows: list[dict], table: dict[int, tuple[str, int, str]]) -> dict:
    """Spill instructions executed, by source line; long-scoreboard samples on each local load's first reader, by
    the reader's source line; and the totals beside all samples (and those not at a barrier: idle warps wait there)."""
    base = int(rows[0]["Address"], 16)
    where = [table.get(int(row["Address"], 16) - base, ("?", 0, ""))[:2] for row in rows]
    executed, waits = Counter(), Counter()
    for n, row in enumerate(rows):
        source = row["Source"]
        if SPILL.search(source):
            executed[where[n]] += _number(row["Instructions Executed"])
        if not (load := LOCAL_LOAD.search(source)):
            continue
        register = int(load.group(1))
        for k in range(n + 1, min(n + 1 + WINDOW, len(rows))):
            written, read = _operands(rows[k]["Source"])
            if register in read:
                waits[where[k]] += _number(rows[k]["stall_long_sb"])
                break
            if register in written:
                break
    samples = sum(_number(row["Warp Stall Sampling (All Samples)"]) for row in rows)
    at_barriers = sum(_number(row["stall_barrier"]) for row in rows)
    return dict(executed=executed, waits=waits, samples=samples, active=samples - at_barriers)


def main() -> None:
    from benchmarks.explore.sass_lines import line_table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="ncu's source page as CSV (.gz or not)")
    parser.add_argument("cubin", type=Path, help="the profiled kernel's cubin (its carry's kernel.cubin)")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    found = profile(read_rows(args.csv), line_table(args.cubin))
    executed, waits = found["executed"], found["waits"]
    print(f"spill instructions executed: {sum(executed.values()):,.0f}; long-scoreboard samples on their loads' "
          f"readers: {sum(waits.values()):,.0f} of {found['samples']:,.0f} samples ({found['active']:,.0f} not at a "
          f"barrier, {100 * sum(waits.values()) / max(found['active'], 1):.1f}%)")
    print("executed a line:")
    for (name, line), count in executed.most_common(args.top):
        print(f"  {name}:{line}  {count:,.0f}")
    print("readers' waits a line (samples):")
    for (name, line), count in waits.most_common(args.top):
        print(f"  {name}:{line}  {count:,.0f}")


if __name__ == "__main__":
    main()
