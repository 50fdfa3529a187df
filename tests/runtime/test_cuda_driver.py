"""The launch's shared-memory carveout (runtime/cuda_driver.py); the driver calls themselves run in tests/gpu."""
from __future__ import annotations

import pytest

from runtime.cuda_driver import carveout_percent

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
