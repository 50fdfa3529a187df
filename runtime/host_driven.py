"""The host-driven baseline: the artifact's task bodies launched group by group from the host.

Same memory, same tasks, same bodies as the persistent megakernel, but one kernel launch per task
group (launch order is the dependency order, so no events) and a host loop over steps. It is baseline
(c) of the decode benchmark (captured in a CUDA graph, one step per replay) and a cross-check of the
persistent kernel's synchronisation. Its two kernels (the template's `_plan` and `_group`) run in Triton's
interpreter on the CPU; for a GPU they are compiled ahead of time, as the megakernel is (`precompile`).

With `gluon`, it is also where the megakernel's Gluon bodies (codegen/gluon) land one at a time: each stands in for
the Triton group kernel in the steps and groups it covers (today a prefill step's projections and attention, a decode
step's attention where its sequences fill the GPU, and a one-row step's projections: `runtime.gluon.GluonGroups`), so
that the model's logits through the mixed executor check the body and its group's time in the step is its figure.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

import torch

from codegen.kernel_abi import HOST_KERNELS, KERNEL_NAME
from codegen.tasks import FLAGS, STREAMS
from runtime.artifact import Artifact, import_source
from runtime.megakernel import (Completion, HangError, Megakernel, compiled_kernel, use_scratch_allocator,
                                wait_for)
from runtime.sampling import SamplingParams


class HostDriven:
    def __init__(self, kernel: Megakernel, gluon: bool = False, chain: bool = False) -> None:
        """gluon: the groups a Gluon body covers run it (a GPU of compute capability 9.0 only); chain: with gluon, a
        prefill step's run of them as one persistent launch (`codegen.gluon.chain`)."""
        self.kernel = kernel
        if kernel.interpret:
            module = import_source(_inlined(kernel.artifact.source_path))
            name = kernel.manifest["kernel"]["name"]
            self.plan, self.group = getattr(module, f"{name}_plan"), getattr(module, f"{name}_group")
        else:
            self.plan, self.group = host_kernels(kernel.artifact)
        self.groups = contiguous_groups(kernel.tasks[:, 3].tolist())
        # the groups that stream a one-row step (`gemv_stream`): then as many CTAs as the persistent launch has
        # programs, a part each, as its programs take them
        self.streamed = {first for first, _ in self.groups if int(kernel.tasks[first, FLAGS]) & STREAMS}
        if chain and not gluon:
            raise ValueError("the persistent chain runs the Gluon bodies: ask for gluon too")
        self.gluon = None
        if gluon:
            from runtime.gluon import GluonGroups  # (here: runtime.gluon imports this module)
            self.gluon = GluonGroups(kernel, self.groups, chain)

    def step(self, step: int, size: tuple[int, int] | None = None) -> None:
        """Step `step`'s launches. `size`: the step's (tokens, sequences) (a one-row step's streamed groups run in
        parts; with `gluon`, which groups the Gluon bodies take depends on it); None reads it from the plan where it
        matters (a wait for the GPU: pass it where the launches are captured)."""
        size = self.plan_step(step, size)
        for first, count in self.groups:
            self.launch_group(first, count, step, size)

    def plan_step(self, step: int, size: tuple[int, int] | None = None) -> tuple[int, int] | None:
        """Plans step `step`; returns its (tokens, sequences): `size`, or read from the plan where the launches
        depend on it."""
        k = self.kernel
        use_scratch_allocator()
        self.plan[(1,)](k.i32, k.f32, step)
        if size is None and (self.streamed or self.gluon):
            size = k.last_step_size()
        return size

    def launch_group(self, first: int, count: int, step: int, size: tuple[int, int] | None) -> None:
        """The launch of the `count` tasks from `first` (a group of `groups`) in step `step` of `size` (tokens,
        sequences)."""
        k = self.kernel
        if self.gluon and self.gluon.launch(first, size):
            return
        parts = min(count, k.programs) if size is not None and size[0] == 1 and first in self.streamed else 0
        self.group[(parts or count,)](k.tasks, k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, first, step,
                                      parts)

    def is_done(self) -> bool:
        return bool(self.kernel.i32[self.kernel.region("control")[0] + 2])

    def run_loop(self, step: int, steps: int, sampling: bool = False, batched: bool = False) -> int:
        """Steps `step` .. (at most `steps`) of one row in one launch (`GluonGroups.launch_loop`; `batched`: steps
        that only decode, in the batched loop), waited for within the kernel's timeout (past it, a `HangError` that
        says which step and group the loop stopped at, from its counters read on a stream of their own, once it has
        been asked to stop: its waits give up, and the launch ends unless a copy inside a program is what hangs); a
        step the loop planned but left (not one it takes) then runs here. `sampling`: some request samples with a
        temperature (`GluonGroups.launch_loop`). Returns the next step's number."""
        k, g = self.kernel, self.gluon
        if g is None or not g.chain:
            raise ValueError("the decode loops are the Gluon chain's: ask for gluon and chain")
        side = torch.cuda.Stream()  # (made before the launch: a host call that waits for the GPU would hang after it)
        g.launch_loop(step, steps, sampling, batched=batched)
        end = torch.cuda.Event()
        end.record()
        if not wait_for(end, k.timeout_s):
            report = g.loop_hang(step, steps, k.timeout_s, side)
            ended = wait_for(end, STOP_S)
            raise HangError(report + ("; stopped" if ended else
                                      f"; still running {STOP_S:.0f} s after it was asked to stop"))
        control = k.region("control")[0]
        num_tokens, num_seqs, done, last = k.i32[control:control + 4].tolist()
        if not g.loop_ran(step, last) and not done:  # (planned, and not one the loop takes)
            for first, count in self.groups:
                self.launch_group(first, count, last, (num_tokens, num_seqs))
        return last + 1

    def generate(self, prompts: list[list[int]], params: SamplingParams, max_steps: int | None = None,
                 loop: bool = False) -> list[Completion]:
        """As `Megakernel.generate`, a step at a time (at most `max_steps`: requests left unfinished say so); with
        `loop` (the Gluon chain's), once a step decodes one sequence alone the steps after it in one launch
        (`run_loop`) for as long as they are of one row, and once a step of more only decodes, the steps after it in
        the batched loop for as long as they only decode."""
        num_steps = self.kernel.prepare(prompts, params)
        limit = num_steps if max_steps is None else min(num_steps, max_steps)
        sampling = any(p.temperature != 0 for p in (params if isinstance(params, list) else [params]))
        step = 0
        while step < limit:
            size = self.kernel.last_step_size() if loop and step > 0 else None
            if size == (1, 1) and len(prompts) == 1:
                step = self.run_loop(step, limit - step, sampling)
            elif self.gluon is not None and self.gluon.batched(size):
                step = self.run_loop(step, limit - step, sampling, batched=True)
            else:
                self.step(step)
                step += 1
            if self.is_done():
                break
        return self.kernel.completions(len(prompts))


STOP_S = 30.0  # how long a stopped loop is given to run on to its end


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


def host_kernels(artifact: Artifact) -> tuple[_Ahead, _Ahead]:
    """The artifact's `_plan` and `_group` kernels for its GPU, compiled ahead of time (`codegen.compile.
    compile_host_kernels`) into Blink's cache beside its cubins (`cubins/host-KEY`, KEY: the inlined source, the
    target and Triton's version) by the first call, on whatever machine: `precompile` on the CPU machine, so that the
    GPU machine loads them (JIT compiled `_group` at its first launch there: a minute of ptxas every session)."""
    folder = precompile(artifact)
    kernels = []
    for name in HOST_KERNELS:
        meta = json.loads((folder / f"{name}.json").read_text())
        kernels.append(_Ahead(compiled_kernel(f"{KERNEL_NAME}_{name}", meta["signature"], meta["triton_metadata"],
                                              (folder / f"{name}.cubin").read_bytes(), folder.name)))
    return kernels[0], kernels[1]


def precompile(artifact: Artifact) -> Path:
    """The folder of the artifact's host-driven kernels in Blink's cache, compiled into it if not there yet."""
    kernel = artifact.manifest["kernel"]
    if kernel["triton_metadata"] is None:
        raise ValueError("this artifact was compiled for the interpreter only (no target to compile for)")
    return precompile_source(artifact.source_path, kernel["signature"], kernel["triton_metadata"]["target"]["arch"])


def precompile_source(source_path: Path, signature: dict[str, str], arch: int) -> Path:
    """`precompile` from the kernel's source, its signature and target (`blinkc.build` runs it beside the kernel's own
    compile, before the artifact exists)."""
    source = _inlined(source_path)
    folder, there = host_folder(source, arch)
    if there:
        return folder
    from codegen.compile import compile_host_kernels

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", suffix=".tmp", dir=folder.parent))
    try:
        for name, (cubin, metadata, types) in compile_host_kernels(source, signature, arch).items():
            (tmp / f"{name}.cubin").write_bytes(cubin)
            (tmp / f"{name}.json").write_text(json.dumps({"signature": types, "triton_metadata": metadata},
                                                         default=vars))
        shutil.rmtree(folder, ignore_errors=True)  # what a compile that stopped halfway left
        tmp.rename(folder)
    except OSError:  # a compile of the same key beside this one got there first
        if not all((folder / f"{name}.json").exists() for name in HOST_KERNELS):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def host_folder(inlined: Path, arch: int) -> tuple[Path, bool]:
    """The cache folder of the host-driven kernels of an inlined source (`_inlined`) for sm_arch (`cubins/host-KEY`,
    KEY: the source, the target and Triton's version), and whether they are in it."""
    from blinkc.env import cache_dir

    key = hashlib.sha256(f"{inlined.read_text()}|sm_{arch}|{version('triton')}".encode()).hexdigest()[:24]
    folder = cache_dir() / "cubins" / f"host-{key}"
    return folder, all((folder / f"{name}.json").exists() for name in HOST_KERNELS)


class _Ahead:
    """A kernel compiled ahead of time, launched as a JIT one is: `kernel[grid](*args)`, a grid of 1 to 3 sizes."""

    def __init__(self, compiled) -> None:
        self.compiled = compiled

    def __getitem__(self, grid: tuple[int, ...]):
        return self.compiled[tuple(grid) + (1,) * (3 - len(grid))]


def contiguous_groups(signals: list[int]) -> list[tuple[int, int]]:
    """(first task, number of tasks) of each run of tasks that signal the same event."""
    groups, start = [], 0
    for i in range(1, len(signals) + 1):
        if i == len(signals) or signals[i] != signals[start]:
            groups.append((start, i - start))
            start = i
    return groups


def capture_step(driver: HostDriven, step: int, size: tuple[int, int]) -> torch.cuda.CUDAGraph:
    """One step's launches in one CUDA graph (baseline (c) of the decode benchmark); `size`: the step's (tokens,
    sequences)."""
    driver.step(step, size)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        driver.step(step, size)
    return graph
