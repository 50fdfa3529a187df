"""Whether a change to codegen/gluon changed what the GPU runs: two carries' Gluon kernels (`carry.py`, one made
before the change and one after, for the same artifacts and launches) compared by their SASS, instruction for
instruction (addresses and encodings left out), then with registers' names left out too. A refactor whose kernels
come out the same needs no GPU run. A kernel reported changed wants a look at its instructions' diff (session 76,
`qkv._scaled` taking pair tiles: the batched kernels the same, one prefill chain's 54 lines of 18,904 two registers'
roles swapped and independent instructions reordered) or its GPU tests.

    BLINK_CACHE_DIR=.blink-cache/c78 python -m benchmarks.explore.carry /tmp/before 9ccdf6:batch,traced f99ed3:one
    (change the code)
    BLINK_CACHE_DIR=.blink-cache/c78 python -m benchmarks.explore.carry /tmp/after 9ccdf6:batch,traced f99ed3:one
    python -m benchmarks.explore.sass_same /tmp/before /tmp/after
"""
from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
from collections import Counter
from pathlib import Path

from benchmarks.explore.sass_lines import NVDISASM

CUOBJDUMP = NVDISASM.with_name("cuobjdump")
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(.*?);")
REGISTER = re.compile(r"\bU?R\d+\b|\bU?P\d\b")


def instructions(cubin: Path) -> list[str]:
    """The cubin's SASS instructions, in order, without their addresses and encodings."""
    listing = subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], capture_output=True, text=True, check=True)
    return [found.group(1).strip() for line in listing.stdout.splitlines() if (found := INSTRUCTION.match(line))]


def fingerprints(carry: Path) -> dict[str, tuple[str, str, int]]:
    """Each Gluon kernel of a carry: its SASS's hash, the hash with registers' names left out, its length."""
    found = {}
    for kernel in sorted((carry / "cubins").glob("gluon-*")):
        code = instructions(kernel / "kernel.cubin")
        exact = hashlib.sha1("\n".join(code).encode()).hexdigest()[:12]
        shape = hashlib.sha1("\n".join(REGISTER.sub("R", line) for line in code).encode()).hexdigest()[:12]
        found[kernel.name] = (exact, shape, len(code))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = fingerprints(args.before), fingerprints(args.after)
    exact = Counter(v[0] for v in before.values()) == Counter(v[0] for v in after.values())
    shape = Counter(v[1] for v in before.values()) == Counter(v[1] for v in after.values())
    print(f"{len(before)} kernels before, {len(after)} after: "
          + ("the same SASS" if exact else "the same SASS but for registers' names" if shape else "different SASS"))
    if not shape:
        for side, mine, theirs in (("before", before, after), ("after", after, before)):
            left = Counter(v[1] for v in mine.values()) - Counter(v[1] for v in theirs.values())
            for name, (_, fingerprint, length) in mine.items():
                if left[fingerprint]:
                    print(f"  only {side}: {name} ({length} instructions)")


if __name__ == "__main__":
    main()
