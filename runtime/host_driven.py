"""The host-driven baseline: the artifact's task bodies launched group by group from the host.

Same memory, same tasks, same bodies as the persistent megakernel, but one kernel launch per task
group (launch order is the dependency order, so no events) and a host loop over steps. It is baseline
(c) of the decode benchmark (captured in a CUDA graph, one step per replay) and a cross-check of the
persistent kernel's synchronisation.

With `gluon`, it is also where the megakernel's Gluon bodies (codegen/gluon) land one at a time: each stands in for
the Triton group kernel in the steps and groups it covers (today the projections' prefill, `GluonPrefill`), so that
the model's logits through the mixed executor check the body and its group's time in the step is its figure.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch

from codegen.tasks import FLAGS, STREAMS, Kind
from runtime.artifact import import_source
from runtime.megakernel import Completion, Megakernel, use_scratch_allocator
from runtime.sampling import SamplingParams


class HostDriven:
    def __init__(self, kernel: Megakernel, gluon: bool = False) -> None:
        """gluon: the groups a Gluon body covers run it (a GPU of compute capability 9.0 only)."""
        self.kernel = kernel
        module = import_source(_inlined(kernel.artifact.source_path))
        name = kernel.manifest["kernel"]["name"]
        self.plan, self.group = getattr(module, f"{name}_plan"), getattr(module, f"{name}_group")
        self.groups = _contiguous_groups(kernel.tasks[:, 3].tolist())
        # the groups that stream a one-row step (`gemv_stream`): then as many CTAs as the persistent launch has
        # programs, a part each, as its programs take them
        self.streamed = {first for first, _ in self.groups if int(kernel.tasks[first, FLAGS]) & STREAMS}
        self.prefill = GluonPrefill(kernel, self.groups) if gluon else None

    def step(self, step: int, rows: int | None = None) -> None:
        """Step `step`'s launches. `rows`: the step's tokens (a one-row step's streamed groups run in parts, a
        prefill's projections on Gluon tiles with `gluon`); None reads them from the plan where it matters (a wait
        for the GPU: pass them where the launches are captured)."""
        rows = self.plan_step(step, rows)
        for first, count in self.groups:
            self.launch_group(first, count, step, rows)

    def plan_step(self, step: int, rows: int | None = None) -> int | None:
        """Plans step `step`; returns its tokens (`rows`, or read from the plan where the launches depend on them)."""
        k = self.kernel
        use_scratch_allocator()
        self.plan[(1,)](k.i32, k.f32, step)
        if rows is None and (self.streamed or self.prefill):
            rows = k.last_step_size()[0]
        return rows

    def launch_group(self, first: int, count: int, step: int, rows: int | None) -> None:
        """The launch of the `count` tasks from `first` (a group of `groups`) in step `step` of `rows` tokens."""
        k = self.kernel
        if self.prefill and self.prefill.launch(first, rows):
            return
        parts = min(count, k.programs) if rows == 1 and first in self.streamed else 0
        self.group[(parts or count,)](k.tasks, k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, first, step,
                                      parts)

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


def capture_step(driver: HostDriven, step: int, rows: int) -> torch.cuda.CUDAGraph:
    """One step's launches in one CUDA graph (baseline (c) of the decode benchmark); `rows`: the step's tokens."""
    driver.step(step, rows)  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        driver.step(step, rows)
    return graph


class GluonPrefill:
    """The projections' prefill in Gluon (codegen/gluon: `linear.linear_prefill`, `qkv.qkv_prefill`): a step of more
    tokens than the batched blocks take (`CompileConfig.wide_rows`: the Triton tasks then run the prefill tiles)
    launches them, one program an SM, for each LINEAR and QKV group they can take, in place of the group's Triton
    tasks."""

    def __init__(self, kernel: Megakernel, groups: list[tuple[int, int]]) -> None:
        from codegen.bodies.linear import LINEAR_FIELDS
        from codegen.bodies.qkv import QKV_FIELDS
        from codegen.gluon import linear, qkv

        if kernel.device.type != "cuda" or torch.cuda.get_device_capability(kernel.device) != (9, 0):
            raise ValueError("the Gluon bodies are written for Hopper (sm_90): this device cannot run them")
        if kernel.dtype != torch.bfloat16:
            raise ValueError(f"the Gluon bodies take bf16 models, not {kernel.manifest['model']['dtype']}")
        self.kernel, self.linear, self.qkv = kernel, linear, qkv
        cfg = kernel.config
        self.min_rows = (cfg.wide_m or (32 if cfg.max_batch <= 32 else 64)) + 1  # (`CompileConfig.wide_rows`)
        self.norm_f64 = bool(cfg.exact_norm_sums)
        self.programs = torch.cuda.get_device_properties(kernel.device).multi_processor_count
        # (the plan's first control word is the step's tokens)
        self.tokens_at, self.positions_at, self.slots_at = (kernel.region(name)[0]
                                                            for name in ("control", "positions", "slots"))
        descs, tasks = kernel.descs.cpu().tolist(), kernel.tasks.cpu()
        self.covered: dict[int, int] = {}  # first task of a group -> its descriptor's row
        self.kinds: dict[int, Kind] = {}
        self.skipped: dict[int, str] = {}  # ... -> why it is left to the Triton tasks
        self.tiles = None  # every launch's tile shape (`linear.Tiles`); None: `linear.tiles_for` picks
        self.gated: dict[int, bool] = {}
        self.columns: dict[int, int] = {}  # a group's weight rows
        for first, _ in groups:
            kind, desc = Kind(int(tasks[first, 0])), int(tasks[first, 1])
            if kind == Kind.LINEAR:
                f = dict(zip(LINEAR_FIELDS, descs[desc]))
                why = linear.unsupported(descs[desc][:len(LINEAR_FIELDS)])
                self.gated[first], self.columns[first] = bool(f["gated"]), f["n"]
            elif kind == Kind.QKV:
                f = dict(zip(QKV_FIELDS, descs[desc]))
                why = qkv.unsupported(descs[desc][:len(QKV_FIELDS)])
                self.columns[first] = (f["num_q_heads"] + 2 * f["num_kv_heads"]) * f["head_dim"]
            else:
                continue
            if why:
                self.skipped[first] = why
            else:
                self.covered[first], self.kinds[first] = desc, kind

    def launch(self, first: int, rows: int | None) -> bool:
        """Launches the group of tasks from `first` in a step of `rows` tokens, if it is one this covers."""
        if first not in self.covered or rows is None or rows < self.min_rows:
            return False
        k, linear, desc = self.kernel, self.linear, self.covered[first]
        tiles = self.tiles or linear.tiles_for(rows, self.columns[first], self.programs)
        grid = min(self.programs, -(-rows // linear.BM.value) * -(-self.columns[first] // tiles.bn))
        if self.kinds[first] == Kind.QKV:
            self.qkv.qkv_prefill[(grid, )](k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, desc,
                                          self.tokens_at, self.positions_at, self.slots_at,
                                          **self.qkv.constexprs(tiles, self.norm_f64), **self.qkv.LAUNCH)
            return True
        linear.linear_prefill[(grid, )](k.descs, k.weights, k.act, k.f32, k.i32, desc, self.tokens_at,
                                        **tiles.constexprs(self.gated[first], self.norm_f64), **linear.LAUNCH)
        return True
