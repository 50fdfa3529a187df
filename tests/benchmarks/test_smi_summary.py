"""`scripts/gpu_check.sh`'s power line (benchmarks/explore/smi_summary.py) reads nvidia-smi's samples as written."""
from __future__ import annotations

from benchmarks.explore.smi_summary import summary


def test_the_power_line_counts_the_busy_samples_and_those_under_the_cap(tmp_path):
    samples = tmp_path / "smi.csv"
    samples.write_text(
        "2026/12/01 00:42:25.437, 1980 MHz, 166.07 W, 0x0000000000000000\n"  # (idle: left out)
        "2026/12/01 00:42:26.319, 1515 MHz, 681.55 W, 0x0000000000000004\n"
        "2026/12/01 00:42:26.420, 1785 MHz, 701.43 W, 0x0000000000000004\n"
        "2026/12/01 00:42:26.923, 1980 MHz, 693.97 W, 0x0000000000000000\n"
        "2026/12/01 00:42:27.0")  # (a line cut short as the sampler was stopped)
    assert summary(str(samples)) == ("power: 3 samples above 300 W, median 694 W; SM clock median 1785 MHz, least "
                                     "1515; under the power cap 67% of them")


def test_an_idle_call_says_so(tmp_path):
    samples = tmp_path / "smi.csv"
    samples.write_text("2026/12/01 00:42:25.437, 1980 MHz, 76.00 W, 0x0000000000000000\n")
    assert summary(str(samples)) == "power: no sample above 300 W"
