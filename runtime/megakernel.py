"""Loading a compiled megakernel and running requests through it.

No model definition and no recompilation: the manifest says how to lay out memory, where the weights
come from and how to launch. On a GPU the cubin is launched with one program per co-resident slot
(as many as the driver's occupancy query allows, up to the manifest's per-SM count and target_programs, with L1
kept for what shared memory does not need); on a CPU the kernel source runs in the Triton interpreter
with a grid of one program.
"""
from __future__ import annotations

import json
import os
import random
import tempfile
import time
import warnings
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from codegen.layout import ABORT_ASKED, ABORT_ASKED_RECORDED, CONTROL_FIELDS, HANG_SPLIT_TICKET, aligned
from codegen.tasks import schedule as task_schedule
from ir.ops.attention import rope_cos_sin
from runtime.artifact import Artifact, import_source
from runtime.checkpoint import CheckpointIndex
from runtime.cuda_driver import carveout_percent, max_active_programs, reserve_shared_memory
from runtime.sampling import SamplingParams
from runtime.weights import WeightSpec, checkpoint_shapes, place_weights, random_reader, transform_weight

_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
FINISH_REASONS = {1: "length", 2: "stop"}
STOP_GRACE_S = 5.0  # how long a kernel asked to stop (its launch ran past the timeout) has to end
FLOAT_REGIONS = ("req_temperature", "req_top_p")  # the requests' words in F32, staged and copied as one span
SPIN_S = 0.1  # how long the host asks back to back whether a launch has ended (`wait_for`), then ...
POLL_S = 1e-4  # ... how often


class HangError(TimeoutError):
    """The kernel stopped waiting: which step, task and event it was waiting on."""


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    finish_reason: str


def parse_step_log(words: torch.Tensor) -> list[tuple[int, int, int]]:
    """The step log's int32 words, 4 per step (timer low and high word, tokens, sequences) -> (timer ns,
    tokens, sequences) of each step that ran (a launch starts from zeroed words)."""
    log = words.view(-1, 4).to(torch.int64)
    clock = (log[:, 1] << 32) | (log[:, 0] & 0xFFFFFFFF)
    return [(int(clock[s]), int(log[s, 2]), int(log[s, 3])) for s in range(log.shape[0]) if clock[s] != 0]


class Megakernel:
    def __init__(self, artifact: Artifact, device: str | torch.device, checkpoint_dir: Path | None = None,
                 timeout_s: float = 600.0, gluon: bool | None = None) -> None:
        """gluon: requests run on the Gluon kernels (`_gluon`): None where they can run them (a Hopper GPU, a bf16
        model whose one-row step they take whole; a batch, where the batched loop takes its decode steps), True: or a
        ValueError that says why one request cannot, False: never."""
        self.artifact, self.manifest = artifact, artifact.manifest
        self.device, self.timeout_s = torch.device(device), timeout_s
        self.config = SimpleNamespace(**self.manifest["config"])
        self.layout = self.manifest["layout"]
        self._i32_offsets = {name: offset for name, (arena, offset, _) in self.layout["regions"].items()
                             if arena == "I32"}
        self.dtype = _DTYPES[self.manifest["model"]["dtype"]]
        self.interpret = self.device.type == "cpu"
        if self.interpret and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("running on the CPU needs TRITON_INTERPRET=1 set before triton is imported")
        if not self.interpret and artifact.cubin_path is None:
            raise ValueError("this artifact was compiled for the interpreter only (no cubin)")
        self.weights = self._place_weights(checkpoint_dir)
        sizes = self.layout["sizes"]
        self.act = torch.zeros(max(sizes["ACT"], 1), dtype=self.dtype, device=self.device)
        self.f32 = torch.zeros(sizes["F32"], dtype=torch.float32, device=self.device)
        # the requests' words go through page-locked host memory, copied without stopping the host (a pageable
        # copy waits for itself), and the state comes back the same way; `_staged` marks the last copy out of it
        pinned = self.device.type == "cuda"
        self._float_span = float_span(self.layout["regions"])
        self._f32_host = torch.zeros(self._float_span[1] - self._float_span[0], dtype=torch.float32,
                                     pin_memory=pinned)
        self._i32_back = torch.zeros(sizes["I32"], dtype=torch.int32, pin_memory=pinned)
        self._staged = torch.cuda.Event() if pinned else None
        self._f32_requests = self.f32[self._float_span[0]:self._float_span[1]]
        # what `_ask_to_stop` needs, made now: page-locked memory allocated while the kernel runs would wait for it
        # to end (CUDA's implicit synchronization)
        self._asked = torch.full((1,), ABORT_ASKED, dtype=torch.int32, pin_memory=pinned)
        self._side = torch.cuda.Stream(self.device) if pinned else None
        self.tasks = artifact.tables["tasks"].to(self.device)
        self.descs = artifact.tables["descs"].to(self.device)
        for name, inv_freq in artifact.tables.items():  # each position's rotary cos and sin, as HF's
            if name.startswith("rope:"):
                offset = self.region(name)[0]
                cos, sin = rope_cos_sin(inv_freq.to(self.device), torch.arange(self.config.max_model_len,
                                                                               device=self.device))
                table = torch.cat([cos, sin], 1).flatten()
                self.f32[offset:offset + table.numel()] = table
        self.kv = torch.zeros(0, dtype=self.dtype, device=self.device)
        is_profiled = getattr(self.config, "profile", False)
        self.profile = torch.zeros(self.tasks.shape[0] * 4 if is_profiled else 1, dtype=torch.int64, device=self.device)
        self.kernel, self.grid = self._load_kernel()
        # CUDA events around each launch, for the benchmarks: the kernel's own time, without the host's
        self.time_launches, self.last_launch_ms = False, None
        # which program runs which task, for this launch's grid; the groups' claim counters follow the events
        schedule, counters = task_schedule(artifact.tables["tasks"], len(self.manifest["events"]), self.programs)
        self.schedule = schedule.to(self.device)
        # the I32 arena and the events in one allocation with one host image: the copy of a launch's requests
        # zeroes the events too, a call of the host's fewer than a fill of their own
        num_words = sizes["I32"] + len(self.manifest["events"]) + counters
        self._words = torch.zeros(num_words, dtype=torch.int32, device=self.device)
        self.i32, self.events = self._words[:sizes["I32"]], self._words[sizes["I32"]:]
        self._i32_host = torch.zeros(num_words, dtype=torch.int32, pin_memory=pinned)
        self.gluon, self.gluon_batch, self.no_gluon = self._gluon(gluon)

    @property
    def programs(self) -> int:
        """Programs the persistent launch runs."""
        return (self.grid or self.kernel.grid)[0]

    @classmethod
    def load(cls, path: Path, device: str | torch.device | None = None, checkpoint_dir: Path | None = None,
             timeout_s: float = 600.0, gluon: bool | None = None) -> Megakernel:
        artifact = Artifact.load(path)
        if device is None:
            device = "cuda" if torch.cuda.is_available() and artifact.cubin_path else "cpu"
        return cls(artifact, device, checkpoint_dir, timeout_s, gluon)

    def _gluon(self, wanted: bool | None):
        """The Gluon kernels' runners (`runtime.gluon.runners`): one request's (`OneRequest`: its prompt's chunks
        through the Gluon bodies, the layers of a step as one persistent launch, then its decode steps in the one-row
        loop, `codegen.gluon.chain.decode_chain` over steps, each planned, run and sampled on the GPU), a batch's
        (`Batch`: this kernel's steps until every request only decodes, then the batched loop), and why there is no
        one-request runner (None if there is). H200, Llama-3-8B (session 66): a token every 3.97 ms at context 512
        against 4.52 in this kernel alone, the first of a 512-token prompt in 13.1 ms against 17.1."""
        if wanted is False:
            return None, None, "not asked for"
        one = batch = None
        if self.interpret:
            why = "the interpreter runs the Triton kernel alone"
        else:
            from runtime.gluon import runners
            try:
                one, batch, why = runners(self)
            except ValueError as e:
                why = str(e)
        if wanted and one is None:
            raise ValueError(f"no Gluon kernels: {why}")
        return one, batch, why

    # -- setup --------------------------------------------------------------------------------------------
    def region(self, name: str) -> tuple[int, int]:
        _, offset, size = self.layout["regions"][name]
        return offset, size

    def _place_weights(self, checkpoint_dir: Path | None) -> torch.Tensor:
        specs = [WeightSpec(name, tuple(shape), _DTYPES[dtype], tuple((k, tuple(tuple(i) if isinstance(i, list) else i
                                                                                 for i in idx)) for k, idx in sources))
                 for name, shape, dtype, sources in self.manifest["weights"]["specs"]]
        packed = torch.empty(max(self.layout["sizes"]["W"], 1), dtype=self.dtype, device=self.device)
        views = {}
        for spec in specs:
            offset, size = self.region(f"param:{spec.name}")
            views[spec.name] = packed[offset:offset + size].view(spec.shape)
        source = self.manifest["weights"]["source"]
        if checkpoint_dir is not None or source["kind"] == "checkpoint":
            reader = CheckpointIndex.open(Path(checkpoint_dir or source["path"])).read
        else:
            reader = random_reader(checkpoint_shapes(specs), source["seed"], source["std"], self.dtype, self.device)
        place_weights(specs, reader, self.device, destinations=views)
        transforms = self.manifest["weights"]["transforms"]  # codegen/lower.py, Lowering.placed_weight
        for t in transforms:
            src = views[t["param"]]
            offset, size = self.region(t["region"])
            scale = views[t["scale_columns"]] if t["scale_columns"] else None
            transform_weight(packed[offset:offset + size].view(src.shape), src, scale, t["interleave_rows"])
        transformed = {t["param"] for t in transforms if t["region"] == f"param:{t['param']}"}  # in place
        self.weight_views = {name: view for name, view in views.items() if name not in transformed}
        self._weight_specs, self._weight_reader = {s.name: s for s in specs}, reader
        return packed

    def step_log(self) -> list[tuple[int, int, int]]:
        """(global timer in ns when the step was planned, its tokens, its sequences) for each step of the
        last launch, from the log GPU builds keep (empty in the interpreter). The log is a ring of STEP_LOG
        entries: in a launch of more steps the latest overwrite the oldest."""
        offset, size = self.region("step_log")
        return parse_step_log(self.i32[offset:offset + size].cpu())

    def last_step_size(self) -> tuple[int, int]:
        """(tokens, sequences) of the step planned last."""
        control = self.region("control")[0]
        tokens, seqs = self.i32[control:control + 2].tolist()
        return tokens, seqs

    def checkpoint_weight(self, name: str) -> torch.Tensor:
        """A weight in its checkpoint form: the placed view, or read again from the weights' source where the
        kernel holds it transformed (see codegen/lower.py, `placed_weight`)."""
        if name in self.weight_views:
            return self.weight_views[name]
        return place_weights([self._weight_specs[name]], self._weight_reader, self.device)[name]

    def _load_kernel(self):
        if self.interpret:
            module = import_source(self.artifact.source_path)
            return getattr(module, self.manifest["kernel"]["name"]), (1,)
        return _load_cubin(self.artifact, self.manifest), None

    # -- running ------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: list[SamplingParams] | SamplingParams,
                 max_steps: int | None = None) -> list[Completion]:
        """max_steps: stop after that many steps (requests not finished by then end "incomplete"), so that a
        check can read any step's logits (`last_logits`)."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        bound = self.prepare(prompts, params)
        steps = bound if max_steps is None else min(max_steps, bound)
        runner = self.gluon if len(prompts) == 1 else self.gluon_batch
        if runner is None or len(prompts) > runner.max_requests:
            state = self._launch(steps)
            self._raise_on_hang(state)
        else:  # (on the Gluon kernels)
            run = runner.steps(prompts, params, steps) + (any(p.temperature != 0 for p in params), )
            state = self._launch(steps, (runner, run))
            self._raise_on_hang(state)
            runner.check_ended(state, *run[:2])
        return self.completions(len(prompts), state)

    def read_state(self) -> torch.Tensor:
        """The I32 arena as the kernel left it, on the host (valid until the next read or launch)."""
        if self._staged is None:  # the interpreter's arena is on the host already
            return self.i32
        self._i32_back.copy_(self.i32, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return self._i32_back

    def prepare(self, prompts: list[list[int]], params: list[SamplingParams] | SamplingParams) -> int:
        """Checks the requests and writes them into the kernel's state; returns a bound on the steps."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        self._check_requests(prompts, params)
        return self._write_requests(prompts, params)

    def _check_requests(self, prompts: list[list[int]], params: list[SamplingParams]) -> None:
        cfg, vocab = self.config, self.manifest["model"]["vocab_size"]
        if not 0 < len(prompts) <= cfg.max_batch:
            raise ValueError(f"between 1 and {cfg.max_batch} prompts per launch (compiled max_batch), "
                             f"got {len(prompts)}")
        for prompt, p in zip(prompts, params, strict=True):
            if not prompt or min(prompt) < 0 or max(prompt) >= vocab:
                raise ValueError(f"a prompt must be a non-empty list of token ids in [0, {vocab})")
            if len(prompt) + p.max_tokens > cfg.max_model_len:
                raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({p.max_tokens}) exceeds the compiled "
                                 f"max_model_len ({cfg.max_model_len})")
            if p.max_tokens > cfg.max_new_tokens:
                raise ValueError(f"max_tokens {p.max_tokens} exceeds the compiled max_new_tokens "
                                 f"({cfg.max_new_tokens})")
            if p.stop_token_ids:
                raise ValueError("stop_token_ids are not supported by the megakernel yet (EOS ids only)")

    def _write_requests(self, prompts: list[list[int]], params: list[SamplingParams]) -> int:
        """The requests' words, written into a host image of the I32 arena and the events (28K words for
        Llama-3-8B at batch 1, the events zero) and copied in one transfer from page-locked memory, without a host
        sync; their floats likewise. (From pageable memory each copy waited for itself: H200,
        `benchmarks/explore/ttft_parts.py`, `prepare` took 0.4 ms for a 512-token prompt; then 0.25-0.28.)"""
        if self._staged is not None:
            self._staged.synchronize()  # the last copy out of the staging buffers is done before they are rewritten
        cfg, words = self.config, self._i32_host.numpy()
        words.fill(0)
        staged = self._f32_host.numpy()
        staged.fill(0)
        floats = {name: staged[self.region(name)[0] - self._float_span[0]:] for name in FLOAT_REGIONS}
        at, vocab = self._i32_offsets, self.manifest["model"]["vocab_size"]
        eos = list(self.manifest["model"]["eos_token_ids"])[:8]
        words[at["control"] + 4], words[at["control"] + 5] = len(prompts), len(eos)
        words[at["eos_ids"]:at["eos_ids"] + len(eos)] = eos
        page = 0
        for r, (prompt, p) in enumerate(zip(prompts, params)):
            start = r * cfg.max_model_len
            words[at["prompts"] + start:at["prompts"] + start + len(prompt)] = prompt
            for name, value in (("req_prompt_off", start), ("req_prompt_len", len(prompt)),
                                ("req_max_tokens", p.max_tokens), ("req_top_k", min(p.top_k, vocab)),  # same cut
                                ("req_ignore_eos", int(p.ignore_eos)), ("req_seed", _int32_seed(p.seed))):
                words[at[name] + r] = value
            floats["req_temperature"][r], floats["req_top_p"][r] = p.temperature, p.top_p
            num_pages = -(-(len(prompt) + p.max_tokens) // cfg.page_size)
            base = at["req_pages"] + r * cfg.max_pages_per_seq
            words[base:base + num_pages] = np.arange(page, page + num_pages, dtype=np.int32)
            page += num_pages
        self._words.copy_(self._i32_host, non_blocking=True)  # the events' words all zero
        self._f32_requests.copy_(self._f32_host, non_blocking=True)
        if self._staged is not None:
            self._staged.record()
        self._ensure_kv(page)
        return sum(len(q) + p.max_tokens for q, p in zip(prompts, params)) + 1

    def _ensure_kv(self, num_pages: int) -> None:
        m = self.manifest["model"]
        self.kv_plane = num_pages * self.config.page_size * m["num_key_value_heads"] * m["head_dim"]
        needed = m["num_layers"] * 2 * self.kv_plane
        if self.kv.numel() < needed:
            self.kv = torch.zeros(needed, dtype=self.dtype, device=self.device)

    def _args(self, max_steps: int) -> tuple:
        return (self.schedule, self.descs, self.weights, self.act, self.f32, self.i32, self.kv, self.events,
                self.profile, self.kv_plane, self.tasks.shape[0], max_steps)

    def _launch(self, max_steps: int, gluon: tuple | None = None) -> torch.Tensor:
        """Runs the kernel to its end, or with `gluon` (a runner of `runtime.gluon` and its run: what its `steps`
        returned and whether a request samples with a temperature) the runner's launches instead; returns the I32
        arena as it left it, on the host (`read_state`'s)."""
        start = time.perf_counter()
        if self.interpret:
            with warnings.catch_warnings():  # masked-off lanes compute on -inf and padding; results are masked
                warnings.simplefilter("ignore", RuntimeWarning)
                self.kernel[self.grid](*self._args(max_steps))
            return self.i32
        done, stream = torch.cuda.Event(), torch.cuda.current_stream(self.device)  # (looked up once a launch)
        use_scratch_allocator()
        if self.time_launches:
            began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            began.record(stream)
        if gluon is None:
            self.queue_kernel(max_steps, stream)
        else:
            runner, run = gluon
            marks = runner.launch(*run)
        if self.time_launches:
            ended.record(stream)
        # the state's copy back is queued behind the kernel, so that it has arrived when the host sees the end:
        # after the end, each CUDA call of the host's is slow at first (H200 machine, a 512-token prompt's first
        # token: the copy queued and awaited then took 0.19-0.27 ms, a second one right after it 0.03-0.05)
        self._i32_back.copy_(self.i32, non_blocking=True)
        done.record(stream)
        if not wait_for(done, self.timeout_s - (time.perf_counter() - start)):
            if gluon is not None:
                report = runner.hang(marks, *run[:2], self.timeout_s)
                raise HangError(report + ("; stopped" if wait_for(done, STOP_GRACE_S) else
                                          f"; still running {STOP_GRACE_S:.0f} s after it was asked to stop"))
            self._ask_to_stop()
            if not wait_for(done, STOP_GRACE_S):
                raise HangError(f"the kernel is still running after {self.timeout_s:.0f} s and did not stop "
                                f"within {STOP_GRACE_S:.0f} s of being asked")
        if self.time_launches:
            self.last_launch_ms = began.elapsed_time(ended)
        return self._i32_back

    def queue_kernel(self, max_steps: int, stream: torch.cuda.Stream | None = None) -> None:
        """Queues this kernel's launch of up to `max_steps` steps on `stream` (default: the current one), the requests
        as `prepare` wrote them (a GPU only)."""
        stream = stream or torch.cuda.current_stream(self.device)
        self.kernel(*self._args(max_steps), stream=stream.cuda_stream)

    def stop_kernel(self, queued: torch.cuda.Event, planned_from: int | None = None) -> str:
        """Asks this kernel's launch (`queue_kernel`, `queued` recorded behind it) to stop past the timeout, and says
        where it waited (`hang_report`, `planned_from` passed on), once it has ended, or that it has not."""
        self._ask_to_stop()
        if not wait_for(queued, STOP_GRACE_S):
            return f"hang: the kernel ran past {self.timeout_s:.0f} s and did not stop when asked"
        with torch.cuda.stream(self._side):  # (the launches queued behind it may be running still)
            words = self.i32.to("cpu", non_blocking=False)
        return self.hang_report(words, planned_from) or f"hang: the kernel ran past {self.timeout_s:.0f} s"

    def _ask_to_stop(self) -> None:
        """Raises the abort flag (ABORT_ASKED) from a stream of its own while the kernel runs: every wait looks at
        the flag once in 1,024 polls and gives up, the first to see it recording where it was waiting, and a
        program between tasks leaves at its step's end."""
        flag = self.region("control")[0] + CONTROL_FIELDS.index("error_flag")
        with torch.cuda.stream(self._side):
            self.i32[flag:flag + 1].copy_(self._asked, non_blocking=True)
        self._side.synchronize()

    def _raise_on_hang(self, state: torch.Tensor | None = None) -> None:
        """`state`: the I32 arena as the launch left it, if already read back."""
        report = self.hang_report(self.i32 if state is None else state)
        if report:
            raise HangError(report)

    def hang_report(self, words: torch.Tensor, planned_from: int | None = None) -> str | None:
        """Where a launch of this kernel that ran past its timeout waited, from the I32 arena as it left it; None
        where no hang is recorded. `planned_from`: the step a launch queued behind this one planned first (the
        batched loop's, `runtime.gluon.Batch`), whose plan wrote the control words' step after this launch ended: a
        launch stopped between tasks is then said to have stopped before that step (what each wait records, it
        does not rewrite)."""
        control = self.region("control")[0]
        words = words.cpu().numpy()
        flag, step, task, event, seen, target = words[control + 6:control + 12].tolist()
        kind = int(words[control + CONTROL_FIELDS.index("error_kind")])
        if not flag:
            return None
        late = f"the launch ran past {self.timeout_s:.0f} s and was stopped"
        if not kind:  # the host's flag, and no wait saw it: the kernel ended between tasks
            where = f"in step {int(words[control + 3])}" if planned_from is None else f"before step {planned_from}"
            return f"hang: {late} {where}, no task waiting"
        if task == HANG_SPLIT_TICKET:
            where = f"a split of block {event} waited for the block's other splits: {seen} of {target} arrived"
        else:
            name = self.manifest["events"][event] if 0 <= event < len(self.manifest["events"]) else "?"
            who = f"task {task}" if task >= 0 else "the step planner"
            where = f"{who} waited on event {event} ({name}): reached {seen} of {target}"
        stopped = f"{late}; " if kind == ABORT_ASKED_RECORDED else ""
        return f"hang: {stopped}in step {step}, {where}"

    def task_profile(self) -> torch.Tensor:
        """[num_tasks, 5]: global-timer ns (start, waits done, signalled) of each task in the profiled step
        (compiled with `profile`), the program that ran it and that program's SM; zeros for tasks that did not
        run then."""
        words = self.profile.view(-1, 4).cpu()
        return torch.cat([words[:, :3], words[:, 3:] & 0xFFFFFFFF, words[:, 3:] >> 32], 1)

    def last_step_rows(self) -> list[tuple[int, int]]:
        """(request, tokens) of each logits row of the last step that had sequences, in row order: row i's logits
        follow the first `tokens` tokens of its request (the prompt, then the tokens generated)."""
        words = self.read_state()
        num_rows = int(words[self.region("control")[0] + CONTROL_FIELDS.index("logits_seqs")])
        requests, lengths = (self.region(name)[0] for name in ("seq_req", "context_lens"))
        return list(zip(words[requests:requests + num_rows].tolist(), words[lengths:lengths + num_rows].tolist()))

    def last_logits(self) -> torch.Tensor:
        """The fp32 logits [rows, vocab] of the last step that had sequences, a row a sequence (`last_step_rows`
        says whose): for checks against the reference."""
        num_rows = len(self.last_step_rows())
        offset, _ = self.region(self.manifest["model"]["logits_region"])
        vocab = self.manifest["model"]["vocab_size"]
        return self.f32[offset:offset + num_rows * vocab].view(num_rows, vocab)

    def completions(self, num_requests: int, state: torch.Tensor | None = None) -> list[Completion]:
        """Each request's tokens and why it ended; `state`: the I32 arena read back after the launch (default:
        read now)."""
        words = (self.read_state() if state is None else state).numpy()
        out_base, max_new = self.region("out_tokens")[0], self.config.max_new_tokens
        num_out, finished = self.region("req_num_out")[0], self.region("req_finished")[0]
        completions = []
        for r in range(num_requests):
            n = int(words[num_out + r])
            tokens = words[out_base + r * max_new: out_base + r * max_new + n].tolist()
            completions.append(Completion(tokens, FINISH_REASONS.get(int(words[finished + r]), "incomplete")))
        return completions


def zeroed_span(regions: dict[str, list]) -> tuple[int, int]:
    """(offset, size) of the F32 words every step's plan zeroes (`codegen.lower`'s STATS_OFF and STATS_SIZE: the
    norms' sums and the split tasks' tickets, laid out one after another), from a layout's regions (`to_dict`'s,
    the manifest's). (Here, not in codegen/layout.py: the compiler's sources key its cache.)"""
    spans = [(offset, offset + aligned(size)) for name, (arena, offset, size) in regions.items()
             if arena == "F32" and name.startswith(("stats:", "tickets:"))]
    if not spans:
        return 0, 0
    lo = min(a for a, _ in spans)
    return lo, max(b for _, b in spans) - lo


def float_span(regions: dict[str, list]) -> tuple[int, int]:
    """The span of F32 from the first of the requests' float regions (`FLOAT_REGIONS`) to the end of the last,
    staged and copied as one (between them the layout leaves only alignment padding, which nothing reads)."""
    spans = [(offset, offset + size) for name, (arena, offset, size) in regions.items() if name in FLOAT_REGIONS]
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    others = [name for name, (arena, offset, size) in regions.items()
              if arena == "F32" and name not in FLOAT_REGIONS and offset < hi and lo < offset + size]
    if others:
        raise ValueError(f"the layout places {', '.join(others)} among the requests' floats")
    return lo, hi


def wait_for(event: torch.cuda.Event, timeout_s: float, spin_s: float = SPIN_S) -> bool:
    """Whether `event` completed within `timeout_s`: polled back to back for the first `spin_s` (the core given
    up between polls to any other thread that wants it), then every 0.1 ms (POLL_S). A short launch (a first
    token) is noticed at once and the host's work after it runs on a warm core; a long one (a whole generation)
    does not hold a core for its seconds, and its end noticed 0.1-0.2 ms late is nothing beside them.
    H200 machine, Llama-3-8B, a 512-token prompt's first token (`benchmarks/explore/ttft_parts.py`), host to
    host: 16.10-16.16 ms polled back to back, 16.40-16.42 every 0.1 ms, for the kernel's 15.82-15.88 (the end
    noticed 0.03 and 0.11-0.13 ms late; the next request's writes 0.22-0.25 and 0.31-0.32 ms, on a core that
    slept). Before: 0.23-0.28 ms late at 0.5 ms, and 0.45 asleep in the driver on a blocking event."""
    start = time.perf_counter()
    deadline, spin_until = start + timeout_s, start + spin_s
    while not event.query():
        now = time.perf_counter()
        if now > deadline:
            return False
        if now < spin_until:
            os.sched_yield()
        else:
            time.sleep(POLL_S)
    return True


def _int32_seed(seed: int | None) -> int:
    """A request's seed as the kernel's int32 word: seeds in int32's range as they are, others wrapped (any Python
    int is a valid seed, as in vLLM); none, a random one."""
    if seed is None:
        return random.getrandbits(31)
    return (seed + (1 << 31)) % (1 << 32) - (1 << 31)


def use_scratch_allocator() -> None:
    """Lets Triton's launcher take global scratch from torch for a kernel that asks for some (tensor descriptors
    made in the kernel live there, 128 B each a program: `prefill_tma`). Set on every launch: Triton keeps the
    allocator per thread context, and a server may launch from another thread than the one that loaded."""
    import triton
    triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # torch's blocks are aligned to 512 B


def launch_programs(num_sms: int, per_sm: int, max_programs: int | None) -> int:
    """The launch's grid: every co-resident slot, or no more than the tasks were sized for (the compile's
    `target_programs`; None: no cap)."""
    return min(num_sms * per_sm, max_programs or num_sms * per_sm)


def compiled_kernel(name: str, signature: dict[str, str], triton_metadata: dict, cubin: bytes, key: str,
                    constants: dict | None = None):
    """A cubin compiled ahead of time (no JIT: `triton.compile` on any machine) as a Triton CompiledKernel, loaded
    on the current GPU; `kernel[grid](*args)` launches it, its arguments as `signature` names them (a constexpr's
    type "constexpr", its value in `constants` and passed too, as Triton's JIT passes it)."""
    from triton.compiler.compiler import CompiledKernel

    folder = Path(tempfile.mkdtemp(prefix="blink-kernel-"))
    (folder / f"{name}.json").write_text(json.dumps(triton_metadata))
    (folder / f"{name}.cubin").write_bytes(cubin)
    src = SimpleNamespace(constants=constants or {}, signature=signature,
                          fn=SimpleNamespace(arg_names=list(signature), launch_metadata=None))
    compiled = CompiledKernel(src, {f"{name}.json": str(folder / f"{name}.json"),
                                    f"{name}.cubin": str(folder / f"{name}.cubin")}, key)
    compiled._init_handles()
    return compiled


def _load_cubin(artifact: Artifact, manifest: dict):
    """The cubin as a Triton CompiledKernel, launched on as many programs as fit co-resident, at most the
    compile's `target_programs` (`launch_programs`)."""
    kernel_meta = manifest["kernel"]
    installed = version("triton")
    if kernel_meta["triton_version"] != installed:
        raise ValueError(f"the cubin was built with Triton {kernel_meta['triton_version']}, this machine has "
                         f"{installed}: recompile it here")
    arch = kernel_meta["triton_metadata"]["target"]["arch"]
    major, minor = torch.cuda.get_device_capability()
    if arch != major * 10 + minor:
        raise ValueError(f"the cubin targets sm_{arch}, this GPU is sm_{major}{minor}: recompile with --arch "
                         f"{major}{minor}")
    compiled = compiled_kernel(kernel_meta["name"], kernel_meta["signature"], kernel_meta["triton_metadata"],
                               artifact.cubin_path.read_bytes(), kernel_meta["source_sha256"])
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    threads, shared = 32 * kernel_meta["num_warps"], compiled.metadata.shared
    wanted = kernel_meta.get("max_programs_per_sm", 2)
    reserve_shared_memory(compiled.function,
                          carveout_percent(shared, wanted, props.shared_memory_per_multiprocessor))
    per_sm = min(wanted, max_active_programs(compiled.function, threads, shared))
    if per_sm < 1:
        raise RuntimeError(f"the kernel does not fit on an SM ({compiled.n_regs} registers, {shared} B shared)")
    grid = (launch_programs(props.multi_processor_count, per_sm, manifest["config"].get("target_programs")), 1, 1)
    launcher = compiled[grid]
    launcher.grid, launcher.shared = grid, shared
    launcher.n_regs, launcher.n_spills = compiled.n_regs, compiled.n_spills
    return launcher
