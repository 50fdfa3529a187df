"""How the runtime waits for a launch to end (`runtime.megakernel.wait_for`), on a stand-in for a CUDA event."""
from __future__ import annotations

import time

from runtime.megakernel import POLL_S, wait_for


class Event:
    """Completes on its `ends_after`-th query (never, for None), as `torch.cuda.Event.query` reports."""

    def __init__(self, ends_after: int | None) -> None:
        self.ends_after, self.num_queries = ends_after, 0

    def query(self) -> bool:
        self.num_queries += 1
        return self.ends_after is not None and self.num_queries >= self.ends_after


def test_a_launch_that_ends_is_noticed_at_the_query_that_sees_it():
    event = Event(ends_after=5)
    assert wait_for(event, timeout_s=10.0)
    assert event.num_queries == 5


def test_a_launch_that_never_ends_is_given_up_on_after_the_timeout():
    start = time.perf_counter()
    assert not wait_for(Event(ends_after=None), timeout_s=0.05)
    assert 0.05 <= time.perf_counter() - start < 1.0


def test_past_the_spin_the_host_sleeps_between_polls():
    """After `spin_s` each poll is followed by a sleep of at least POLL_S: no more queries than that allows."""
    timeout_s = 0.2
    asleep, spinning = Event(ends_after=None), Event(ends_after=None)
    assert not wait_for(asleep, timeout_s=timeout_s, spin_s=0.0)
    assert asleep.num_queries <= timeout_s / POLL_S + 1
    assert not wait_for(spinning, timeout_s=timeout_s, spin_s=timeout_s)
    assert spinning.num_queries > asleep.num_queries
