"""The launch's shared-memory carveout (runtime/cuda_driver.py) and grid; the driver calls themselves run in
tests/gpu."""
from __future__ import annotations

import pytest

from runtime.cuda_driver import carveout_percent
from runtime.megakernel import launch_programs

H100_SHARED_PER_SM = 233_472


@pytest.mark.parametrize("shared, programs, expected", [
    (49_152, 2, 43),  # 2 x (48 KB + 1 KB reserved) = 100,352 B of 233,472
    (49_280, 2, 44),  # 128 B more rounds up a percent
    (0, 2, 1),
    (200_000, 2, 100),  # more than fits: the driver's occupancy query then allows fewer programs
])
def test_carveout_holds_the_programs(shared, programs, expected):
    percent = carveout_percent(shared, programs, H100_SHARED_PER_SM)
    assert percent == expected
    if percent < 100:
        assert percent * H100_SHARED_PER_SM / 100 >= programs * (shared + 1024)


@pytest.mark.parametrize("num_sms, per_sm, max_programs, expected", [
    (132, 2, 264, 264),  # an H100 or H200: every slot
    (132, 2, 256, 256),  # tasks sized for fewer programs: no more than that
    (108, 2, 264, 216),  # fewer slots than the tasks were sized for: every slot
    (132, 2, None, 264),  # no cap
])
def test_the_grid_takes_the_slots_up_to_the_programs_the_tasks_were_sized_for(num_sms, per_sm, max_programs,
                                                                             expected):
    assert launch_programs(num_sms, per_sm, max_programs) == expected
