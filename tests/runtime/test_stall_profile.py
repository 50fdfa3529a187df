"""How `benchmarks/stall_profile.py` sums Nsight Compute's warp-state samples (the ncu part runs on a GPU only)."""
from __future__ import annotations

from benchmarks.stall_profile import share_table


def test_groups_are_ranked_by_their_share_with_their_largest_reasons():
    samples = {  # pc -> stall reason -> samples
        0x10: {"wait": 30.0, "selected": 10.0},
        0x20: {"long_scoreboard": 20.0},
        0x30: {"barrier": 25.0, "wait": 5.0, "membar": 4.0, "selected": 6.0},
    }
    line = {0x10: "loop", 0x20: "loop", 0x30: "wait_event"}
    assert share_table(samples, line.get, top=5) == [
        " 60.0%  loop: wait 50%, long_scoreboard 33%, selected 17%",
        " 40.0%  wait_event: barrier 62%, selected 15%, wait 12%",
    ]
    assert share_table(samples, line.get, top=1) == [" 60.0%  loop: wait 50%, long_scoreboard 33%, selected 17%"]
