"""The launch's shared-memory carveout (runtime/cuda_driver.py) and grid; the driver calls themselves run in
tests/gpu."""
from __future__ import annotations

import pytest

from runtime.cuda_driver import SM90_SPLITS_KB, carveout_percent
from runtime.megakernel import launch_programs

H100_SHARED_PER_SM = 233_472  # and the H200's


def driver_split(percent: int, shared_per_sm: int) -> int:
    """The split, in bytes, the driver gives an sm_90 SM for a carveout of `percent`: the next it supports."""
    return next(kb * 1024 for kb in SM90_SPLITS_KB if kb * 1024 >= percent * shared_per_sm / 100)


@pytest.mark.parametrize("shared, programs, split_kb", [
    (49_152, 2, 100),  # 2 x (48 KB + 1 KB reserved) = 100,352 B of 233,472
    (73_752, 2, 164),  # Llama-3-8B's kernels with 64-row prefill tiles
    (98_336, 2, 196),  # ... with 128-row ones: 198,720 B, which 86% (rounded up from the bytes) took to 228 KB
    (0, 2, 8),
])
def test_the_carveout_is_the_smallest_split_that_holds_the_programs(shared, programs, split_kb):
    percent = carveout_percent(shared, programs, H100_SHARED_PER_SM)
    assert driver_split(percent, H100_SHARED_PER_SM) == split_kb * 1024
    assert split_kb * 1024 >= programs * (shared + 1024)


def test_more_than_an_sm_holds_asks_for_all_of_it():
    """The driver's occupancy query then allows fewer programs, and the grid shrinks to them."""
    assert carveout_percent(200_000, 2, H100_SHARED_PER_SM) == 100


def test_an_sm_of_unknown_splits_gets_the_percentage_of_the_bytes_needed():
    assert carveout_percent(40_000, 2, 100 * 1024) == 81  # 82,048 B of 102,400: 80.1%, rounded up


@pytest.mark.parametrize("num_sms, per_sm, max_programs, expected", [
    (132, 2, 264, 264),  # an H100 or H200: every slot
    (132, 2, 256, 256),  # tasks sized for fewer programs: no more than that
    (108, 2, 264, 216),  # fewer slots than the tasks were sized for: every slot
    (132, 2, None, 264),  # no cap
])
def test_the_grid_takes_the_slots_up_to_the_programs_the_tasks_were_sized_for(num_sms, per_sm, max_programs,
                                                                             expected):
    assert launch_programs(num_sms, per_sm, max_programs) == expected
