"""The task graph: descriptors, tasks and events, encoded as the int64 tables the megakernel reads.

A task is (kind, descriptor row, tile, the event it signals, up to three waits, an L2 prefetch, flags: whether it
has work only in steps that prefill (such a task neither waits nor runs in a step that only decodes, it signals
at once), whether its group streams a one-row step (its first tasks, one a program, share out the group's work:
codegen/bodies/linear.py, `gemv_stream`), whether it has work only in such a step (a streamed group has a task
a program at least: its tasks past the tiles neither wait nor run in other steps).

A wait (event, count, lag) is satisfied in step s when `events[event] >= count * (s + 1 - lag)`: counters only
grow, so nothing is reset between steps. The prefetch names weights the task will stream whatever its inputs
are: the kernel asks for them before waiting, so they arrive while the producers finish.
Which program runs which task is the launch's: `schedule` fills the last words of each row for its grid.
"""
from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

TASK_WORDS = 22  # kind, desc, tile, signal, 3 x (event, count, lag), 4 prefetch words, flags, 4 schedule
FLAGS = 17
PREFILL_ONLY, STREAMS, STREAM_ONLY = 1, 2, 4  # the flags' bits
NEXT, CLAIM, GROUP_START, GROUP_SIZE = 18, 19, 20, 21  # the schedule words (see `schedule`)
DESC_WORDS = 24
MAX_WAITS = 3


class Kind(enum.IntEnum):
    LINEAR = 0
    QKV = 1
    ATTENTION = 2
    EMBED = 3
    GATHER = 4
    RMS_NORM = 5
    ADD = 6
    ROUTE = 7  # ... each pair appended to its expert's list (8 was a grouping task kind of its own)
    EXPERT = 9
    COMBINE = 10
    SAMPLE = 11


@dataclass(frozen=True)
class Wait:
    event: int
    count: int  # signals per step expected from the event's tasks
    lag: int = 0  # 1: wait for the previous step's signals


@dataclass(frozen=True)
class Prefetch:
    """`rows` segments of `row_bytes` bytes, `stride` bytes apart, from element `offset` of W."""
    offset: int = 0
    stride: int = 0
    rows: int = 0
    row_bytes: int = 0

    def words(self) -> list[int]:
        return [self.offset, self.stride, self.rows, self.row_bytes]


@dataclass(frozen=True)
class Task:
    kind: Kind
    desc: int
    tile: int
    signal: int
    waits: tuple[Wait, ...] = ()
    prefetch: Prefetch = Prefetch()
    prefill_only: bool = False
    streams: bool = False
    stream_only: bool = False


def float_word(x: float) -> int:
    """A float as the int64 bits of a float64 (bodies read it back with `word_f32`)."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


@dataclass
class TaskGraph:
    tasks: list[Task] = field(default_factory=list)
    descs: list[list[int]] = field(default_factory=list)
    event_names: list[str] = field(default_factory=list)
    event_waits: dict[int, tuple[Wait, ...]] = field(default_factory=dict)  # event -> its group's waits

    def new_event(self, name: str) -> int:
        self.event_names.append(name)
        return len(self.event_names) - 1

    def add_desc(self, fields: tuple[str, ...], values: dict[str, int | float]) -> int:
        missing = set(fields) ^ set(values)
        if missing:
            raise ValueError(f"descriptor fields mismatch: {sorted(missing)}")
        row = [float_word(values[f]) if isinstance(values[f], float) else int(values[f]) for f in fields]
        if len(row) > DESC_WORDS:
            raise ValueError(f"descriptor of {len(row)} words exceeds {DESC_WORDS}")
        self.descs.append(row + [0] * (DESC_WORDS - len(row)))
        return len(self.descs) - 1

    def add_group(self, kind: Kind, desc: int, num_tiles: int, name: str, waits: tuple[Wait, ...],
                  prefetch: Callable[[int], Prefetch] | None = None, prefill_only_from: int | None = None,
                  streams: bool = False, stream_only_from: int | None = None) -> Wait:
        """`num_tiles` tasks that all signal one new event (those from tile `prefill_only_from` on have work
        only in steps that prefill; `streams`: the group streams its one-row steps, and its tasks from tile
        `stream_only_from` on have work only in those); returns the wait that covers them."""
        if stream_only_from is not None and not streams:
            raise ValueError(f"{name}: tasks only for streamed steps in a group that does not stream")
        if len(waits) > MAX_WAITS:
            raise ValueError(f"{name}: {len(waits)} waits, at most {MAX_WAITS}")
        event = self.new_event(name)
        self.event_waits[event] = waits
        self.tasks += [Task(kind, desc, tile, event, waits, prefetch(tile) if prefetch else Prefetch(),
                            prefill_only_from is not None and tile >= prefill_only_from, streams,
                            stream_only_from is not None and tile >= stream_only_from)
                       for tile in range(num_tiles)]
        return Wait(event, num_tiles)

    def follows(self, waits: tuple[Wait, ...], event: int) -> bool:
        """Whether a group with these waits starts, within a step, only after every task signalling `event`
        is done: some chain of same-step waits leads from it to `event`."""
        seen, todo = set(), [w.event for w in waits if w.lag == 0]
        while todo:
            e = todo.pop()
            if e == event:
                return True
            if e not in seen:
                seen.add(e)
                todo += [w.event for w in self.event_waits.get(e, ()) if w.lag == 0]
        return False

    def done_before(self) -> list[int]:
        """For each event, a bitmask of the events whose tasks are all done, within a step, before any task that
        signals it starts (`follows` for every pair at once). A group waits only on earlier events."""
        before: list[int] = []
        for event in range(len(self.event_names)):
            mask = 0
            for wait in self.event_waits.get(event, ()):
                if wait.lag == 0:
                    mask |= 1 << wait.event | before[wait.event]
            before.append(mask)
        return before

    def task_table(self) -> torch.Tensor:
        rows = []
        for t in self.tasks:
            waits = [w for wait in t.waits for w in (wait.event, wait.count, wait.lag)]
            waits += [-1, 0, 0] * (MAX_WAITS - len(t.waits))
            flags = PREFILL_ONLY * t.prefill_only | STREAMS * t.streams | STREAM_ONLY * t.stream_only
            rows.append([int(t.kind), t.desc, t.tile, t.signal, *waits, *t.prefetch.words(), flags, -1, -1, 0, 0])
        return torch.tensor(rows, dtype=torch.int64)

    def desc_table(self) -> torch.Tensor:
        return torch.tensor(self.descs or [[0] * DESC_WORDS], dtype=torch.int64)


def schedule(table: torch.Tensor, num_events: int, programs: int) -> tuple[torch.Tensor, int]:
    """The task table of a launch on `programs` programs, [num_tasks + programs, TASK_WORDS], and the number
    of claim counters it uses (events past the `num_events` of the graph).

    The first `programs` tasks of each group (a run of tasks that signal one event) are static: task t runs
    on program t % programs, each program taking its static tasks in order (NEXT: the index of its next one,
    num_tasks after its last; row num_tasks + p holds program p's first). A group of more tasks hands out
    the rest at run time: a program done with one of the group's tasks takes the next from the group's claim
    counter (CLAIM, an index into the events past the graph's; -1 where the group fits one wave), so that a
    slow SM runs fewer of them than a fast one instead of making the whole group wait on its last round.
    A claimed task is known by its place in the group (its tile: `TaskGraph.add_group` numbers them so).
    Every wait is for all of a group's signals, so a program signals its run of a group's tasks once, when it
    leaves the group (the claim past the end), adding their number.
    GROUP_START and GROUP_SIZE: the group's first task and its number of tasks."""
    num_tasks = table.shape[0]
    nexts, claims = [num_tasks] * (num_tasks + programs), [-1] * (num_tasks + programs)
    starts, sizes = [0] * (num_tasks + programs), [0] * (num_tasks + programs)
    signals = table[:, 3].tolist()
    last = list(range(num_tasks, num_tasks + programs))  # the row whose NEXT is each program's next static task
    counters, start = 0, 0
    while start < num_tasks:
        end = start + 1
        while end < num_tasks and signals[end] == signals[start]:
            end += 1
        starts[start:end], sizes[start:end] = [start] * (end - start), [end - start] * (end - start)
        if end - start > programs:
            if table[start:end, 2].tolist() != list(range(end - start)):
                raise ValueError(f"the tasks of group {signals[start]} are not numbered by their place in it")
            claims[start:end] = [num_events + counters] * (end - start)
            counters += 1
        for t in range(start, min(end, start + programs)):
            nexts[last[t % programs]] = t
            last[t % programs] = t
        start = end
    out = torch.zeros(num_tasks + programs, TASK_WORDS, dtype=torch.int64)
    out[:num_tasks, :NEXT] = table[:, :NEXT]
    out[:, NEXT], out[:, CLAIM] = torch.tensor(nexts), torch.tensor(claims)
    out[:, GROUP_START], out[:, GROUP_SIZE] = torch.tensor(starts), torch.tensor(sizes)
    return out, counters
