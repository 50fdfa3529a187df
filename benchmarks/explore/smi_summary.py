"""What the GPU's power and clocks did while a device call ran: `scripts/gpu_check.sh` samples `nvidia-smi` every
100 ms into $OUT/smi.csv (timestamp, SM clock, power, clock event reasons) and prints this at the end.

An H200 lease is not always the same GPU: on some, a b64 decode loop draws its 700 W cap and the SM clock drops to
1.5-1.9 GHz (the torch graph's step drew 590 W at 1.98 GHz), on others it stays at 1.98 GHz (session 76). A figure
that moved between leases may be that, so RESULTS notes which it was.

    python -m benchmarks.explore.smi_summary $OUT/smi.csv
"""
from __future__ import annotations

import csv
import statistics
import sys

SW_POWER_CAP = 0x4  # (`clocks_event_reasons.active`'s bit: the software power cap holds the clocks down)


def summary(path: str, busy_watts: float = 300.0) -> str:
    """One line: of the samples above `busy_watts` (the GPU at work), the median power, the SM clock's median and
    least, and the share of them under the power cap."""
    busy = []
    with open(path) as f:
        for row in csv.reader(f):
            try:
                clock, watts, reasons = int(row[1].split()[0]), float(row[2].split()[0]), int(row[3].strip(), 16)
            except (IndexError, ValueError):  # (a line cut short when the sampler was stopped)
                continue
            if watts > busy_watts:
                busy.append((clock, watts, reasons))
    if not busy:
        return f"power: no sample above {busy_watts:.0f} W"
    capped = sum(1 for _, _, reasons in busy if reasons & SW_POWER_CAP)
    watts = statistics.median(w for _, w, _ in busy)
    clocks = [c for c, _, _ in busy]
    return (f"power: {len(busy)} samples above {busy_watts:.0f} W, median {watts:.0f} W; SM clock median "
            f"{statistics.median(clocks):.0f} MHz, least {min(clocks)}; "
            f"under the power cap {capped / len(busy):.0%} of them")


if __name__ == "__main__":
    print(summary(sys.argv[1]))
