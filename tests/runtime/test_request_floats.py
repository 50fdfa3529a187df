"""The requests' floats are staged and copied as one span of the F32 arena (`runtime.megakernel.float_span`)."""
from __future__ import annotations

import pytest

from codegen.layout import Layout
from runtime.megakernel import FLOAT_REGIONS, float_span


def test_the_span_runs_from_the_first_float_region_to_the_end_of_the_last():
    layout = Layout()
    layout.alloc("logits", "F32", 100)
    first = layout.alloc(FLOAT_REGIONS[0], "F32", 3)
    layout.alloc("slots", "I32", 500)  # another arena's region at the same offsets is not in the way
    second = layout.alloc(FLOAT_REGIONS[1], "F32", 3)
    layout.alloc("rope", "F32", 10)
    assert float_span(layout.to_dict()["regions"]) == (first, second + 3)


def test_a_region_between_the_floats_is_refused():
    layout = Layout()
    layout.alloc(FLOAT_REGIONS[0], "F32", 3)
    layout.alloc("scratch", "F32", 3)
    layout.alloc(FLOAT_REGIONS[1], "F32", 3)
    with pytest.raises(ValueError, match="places scratch among the requests' floats"):
        float_span(layout.to_dict()["regions"])
