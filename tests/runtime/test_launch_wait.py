"""How the runtime waits for a launch to end (`runtime.megakernel.wait_for`), on a stand-in for a CUDA event."""
from __future__ import annotations

import time

from runtime import megakernel
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


def test_the_host_polls_back_to_back_for_spin_s_then_sleeps_between_polls(monkeypatch):
    """Until `spin_s` each poll is followed by a yield of the core, never a sleep; after it, by a sleep of POLL_S."""
    calls, sleep = [], time.sleep
    monkeypatch.setattr(megakernel.os, "sched_yield", lambda: calls.append("yield"))
    monkeypatch.setattr(megakernel.time, "sleep", lambda s: (calls.append(s), sleep(s)))
    # (spin_s past the timeout: at spin_s == timeout_s, a poll at exactly the deadline slept, a flake in CI)
    assert not wait_for(Event(ends_after=None), timeout_s=0.05, spin_s=1.0)
    assert calls and set(calls) == {"yield"}
    calls.clear()
    assert not wait_for(Event(ends_after=None), timeout_s=0.05, spin_s=0.0)
    assert calls and set(calls) == {POLL_S}
