"""The host-driven baseline: the artifact's task bodies launched group by group from the host.

Same memory, same tasks, same bodies as the persistent megakernel, but one kernel launch per task
group (launch order is the dependency order, so no events) and a host loop over steps. It is baseline
(c) of the decode benchmark (captured in a CUDA graph, one step per replay) and a cross-check of the
persistent kernel's synchronisation.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch

from codegen.tasks import FLAGS, STREAMS
from runtime.artifact import import_source
from runtime.megakernel import Completion, Megakernel, use_scratch_allocator
from runtime.sampling import SamplingParams


class HostDriven:
    def __init__(self, kernel: Megakernel) -> None:
        self.kernel = kernel
        module = import_source(_inlined(kernel.artifact.source_path))
        name = kernel.manifest["kernel"]["name"]
        self.plan, self.group = getattr(module, f"{name}_plan"), getattr(module, f"{name}_group")
        self.groups = _contiguous_groups(kernel.tasks[:, 3].tolist())
        # the groups that stream a one-row step (`gemv_stream`): then as many CTAs as the persistent launch has
        # programs, a part each, as its programs take them
        self.streamed = {first for first, _ in self.groups if int(kernel.tasks[first, FLAGS]) & STREAMS}

    def step(self, step: int, one_row: bool | None = None) -> None:
        """Step `step`'s launches. `one_row`: whether the step has one row (its streamed groups then run in
        parts); None reads it from the plan (a wait for the GPU: pass it where the launches are captured)."""
        k = self.kernel
        use_scratch_allocator()
        self.plan[(1,)](k.i32, k.f32, step)
        if one_row is None:
            one_row = bool(self.streamed) and k.last_step_size()[0] == 1
        for first, count in self.groups:
            parts = min(count, k.programs) if one_row and first in self.streamed else 0
            self.group[(parts or count,)](k.tasks, k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, first,
                                          step, parts)

    def is_done(self) -> bool:
        return bool(self.kernel.i32[self.kernel.region("control")[0] + 2])

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        for step in range(self.kernel.prepare(prompts, params)):
            self.step(step)
            if self.is_done():
                break
        return self.kernel.completions(len(prompts))


def _inlined(source_path: Path) -> Path:
    """The kernel source with every body inlined. The persistent kernel may compile some bodies as functions of
    their own (`CompileConfig.outline`, none by default), which changes how its loop's registers are allocated;
    a kernel of one task a CTA has no such loop, and the baseline takes each body at its best."""
    text = source_path.read_text().replace("@triton.jit(noinline=True)", "@triton.jit")
    path = Path(tempfile.gettempdir()) / f"blink-host-driven-{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
    if not path.exists():  # Triton's JIT reads the source from the file: it stays (renamed whole into place)
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_text(text)
        part.replace(path)
    return path


def _contiguous_groups(signals: list[int]) -> list[tuple[int, int]]:
    """(first task, number of tasks) of each run of tasks that signal the same event."""
    groups, start = [], 0
    for i in range(1, len(signals) + 1):
        if i == len(signals) or signals[i] != signals[start]:
            groups.append((start, i - start))
            start = i
    return groups


def capture_step(driver: HostDriven, step: int, one_row: bool) -> torch.cuda.CUDAGraph:
    """One step's launches in one CUDA graph (baseline (c) of the decode benchmark); `one_row`: whether the
    step has one row."""
    driver.step(step, one_row)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        driver.step(step, one_row)
    return graph
