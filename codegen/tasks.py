"""The task graph: descriptors, tasks and events, encoded as the int64 tables the megakernel reads.

A task is (kind, descriptor row, tile, the event it signals, up to three waits, an L2 prefetch). A wait
(event, count, lag) is satisfied in step s when `events[event] >= count * (s + 1 - lag)`: counters only
grow, so nothing is reset between steps. The prefetch names weights the task will stream whatever its
inputs are: the kernel asks for them before waiting, so they arrive while the producers finish.
"""
from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

TASK_WORDS = 17  # kind, desc, tile, signal, 3 x (event, count, lag), 4 prefetch words
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
    ROUTE = 7  # ... and the grouping of the pairs by expert (8 was a task kind of its own)
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
                  prefetch: Callable[[int], Prefetch] | None = None) -> Wait:
        """`num_tiles` tasks that all signal one new event; returns the wait that covers them."""
        if len(waits) > MAX_WAITS:
            raise ValueError(f"{name}: {len(waits)} waits, at most {MAX_WAITS}")
        event = self.new_event(name)
        self.event_waits[event] = waits
        self.tasks += [Task(kind, desc, tile, event, waits, prefetch(tile) if prefetch else Prefetch())
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

    def task_table(self) -> torch.Tensor:
        rows = []
        for t in self.tasks:
            waits = [w for wait in t.waits for w in (wait.event, wait.count, wait.lag)]
            waits += [-1, 0, 0] * (MAX_WAITS - len(t.waits))
            rows.append([int(t.kind), t.desc, t.tile, t.signal, *waits, *t.prefetch.words()])
        return torch.tensor(rows, dtype=torch.int64)

    def desc_table(self) -> torch.Tensor:
        return torch.tensor(self.descs or [[0] * DESC_WORDS], dtype=torch.int64)
