"""Checks on a task graph before any code is generated.

- every wait names an event that some tasks signal, and counts exactly that many signals per step;
- the waits are acyclic and respect task order: a task only waits (within a step) on events whose tasks
  all come before it, so one program running the tasks in order never waits, and with many programs the
  lowest unfinished task is always runnable (no deadlock when every program is co-resident);
- every group leads to sampling, which the next step's planner waits for: so every read of a step is
  finished before the next step overwrites anything;
- activation buffers that share memory are ordered: the later one's writers start only after every group that
  used the earlier one is done (`check_shared_activations`).
"""
from __future__ import annotations

from codegen.tasks import TaskGraph, Wait


class ScheduleError(ValueError):
    pass


def check_schedule(graph: TaskGraph, sample: Wait) -> None:
    signals: dict[int, list[int]] = {}
    for index, task in enumerate(graph.tasks):
        signals.setdefault(task.signal, []).append(index)
    for index, task in enumerate(graph.tasks):
        for wait in task.waits:
            producers = signals.get(wait.event)
            where = f"task {index} ({task.kind.name}) waits on event {wait.event} ({graph.event_names[wait.event]})"
            if not producers:
                raise ScheduleError(f"{where}, which no task signals")
            if wait.count != len(producers):
                raise ScheduleError(f"{where} for {wait.count} signals per step; {len(producers)} tasks signal it")
            if wait.lag == 0 and max(producers) >= index:
                raise ScheduleError(f"{where}, signalled by a later task {max(producers)}: not runnable in order")
    _check_everything_leads_to(graph, sample.event)


def _check_everything_leads_to(graph: TaskGraph, final_event: int) -> None:
    readers: dict[int, set[int]] = {}
    for task in graph.tasks:
        for wait in task.waits:
            if wait.lag == 0:  # a lag-1 wait covers the previous step only: it does not hold this one back
                readers.setdefault(wait.event, set()).add(task.signal)
    reaches = {final_event}
    for event in reversed(range(len(graph.event_names))):
        if readers.get(event, set()) & reaches:
            reaches.add(event)
    dangling = [graph.event_names[e] for e in {t.signal for t in graph.tasks} - reaches]
    if dangling:
        raise ScheduleError(f"groups {dangling[:3]} do not lead to sampling: the next step could overwrite "
                            f"what they read")


def check_shared_activations(graph: TaskGraph, regions: dict[str, tuple[int, int]], uses: dict[str, list[int]],
                             node_events: list[range], kept: set[str]) -> None:
    """`regions`: each activation buffer's (offset, size); `uses`: the nodes (indices, in order) that use it, the
    first its writer; `node_events`: the events each node's groups signal; `kept`: buffers live to the end of a
    step. Wherever two buffers overlap, the earlier must be dead (kept ones never are) and every group of the
    later one's writer must start after every group that used the earlier one is done."""
    done_before = graph.done_before()

    def events(nodes: list[int]) -> list[int]:
        return [event for node in nodes if node < len(node_events) for event in node_events[node]]

    spans = sorted((offset, offset + size, name) for name, (offset, size) in regions.items())
    for i, (start, end, name) in enumerate(spans):
        for other_start, _, other in spans[i + 1:]:
            if other_start >= end:
                break
            first, second = sorted((name, other), key=lambda n: uses[n][0])
            used = events(uses[first])
            if uses[first][0] == uses[second][0] or first in kept or uses[first][-1] >= uses[second][0] or any(
                    (1 << e) & ~done_before[w] for w in events(uses[second][:1]) for e in used):
                raise ScheduleError(f"activation buffers {first} and {second} share memory, but {second}'s writers "
                                    f"may start before every user of {first} is done")
