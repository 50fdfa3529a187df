"""The reference engine: continuous batching over the reference executor, on the host.

It is the oracle for the megakernel's scheduler and the baseline of host-driven serving: each step it
admits waiting requests (chunked prefill within a token budget), decodes the running ones, allocates KV
pages, runs one graph step, samples, and retires finished requests.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import torch

from ir import Graph
from ir.executor import execute
from runtime.kv_pool import PagePool
from runtime.sampling import SamplingParams, sample
from runtime.step import SeqChunk, build_step


@dataclass(frozen=True)
class EngineConfig:
    num_pages: int = 256
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_model_len: int = 4096

    def __post_init__(self) -> None:
        for name in ("num_pages", "max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


@dataclass(eq=False)
class Request:
    id: int
    prompt: list[int]
    params: SamplingParams
    output: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose K/V are in the cache
    finish_reason: str | None = None  # "stop" or "length"
    wants_all_logits: bool = False
    generator: torch.Generator | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


@dataclass(frozen=True)
class StepResult:
    """Per request advanced this step: the logits rows it got (all its tokens, or its last one)."""

    logits: dict[int, torch.Tensor]
    finished: list[Request]


class ReferenceEngine:
    def __init__(self, graph: Graph, params: dict[str, torch.Tensor], eos_token_ids: tuple[int, ...] = (),
                 config: EngineConfig = EngineConfig(), device: str | torch.device = "cpu") -> None:
        self.graph, self.params, self.config, self.device = graph, params, config, device
        self.eos_token_ids = frozenset(eos_token_ids)
        self.page_size = graph.meta["page_size"]
        self.pool = PagePool(config.num_pages, self.page_size)
        self.caches = {v.name: torch.zeros((2, config.num_pages, *v.shape[2:]), dtype=v.dtype.torch, device=device)
                       for v in graph.inputs if v.name.startswith("kv_cache.")}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._ids = itertools.count()

    def add_request(self, prompt: list[int], params: SamplingParams, wants_all_logits: bool = False) -> Request:
        if not prompt:
            raise ValueError("prompt must have at least one token")
        if len(prompt) + params.max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) exceeds "
                             f"max_model_len ({self.config.max_model_len})")
        if self.pool.pages_for(len(prompt) + params.max_tokens) > self.pool.num_pages:
            raise ValueError(f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) needs more KV pages "
                             f"than the pool has ({self.pool.num_pages} of {self.page_size} tokens)")
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        request = Request(next(self._ids), list(prompt), params, wants_all_logits=wants_all_logits, generator=generator)
        self.waiting.append(request)
        return request

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> StepResult:
        chunks = self._schedule()
        if not chunks:
            raise RuntimeError("no request could be scheduled (KV pool too small for the next request)")
        inputs = build_step([c for _, c in chunks], self.page_size, self.device)
        logits = execute(self.graph, self.params, {**inputs, **self.caches})["logits"]
        return self._consume(chunks, logits)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        requests = [self.add_request(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return [r.output for r in requests]

    def _schedule(self) -> list[tuple[Request, SeqChunk]]:
        """Decodes every running request, then admits waiting ones (chunked) while tokens and pages last.

        When pages run out the newest request holding pages is preempted (its pages freed, recomputed
        later), so the oldest request always progresses.
        """
        budget = self.config.max_num_batched_tokens
        chunks = []
        for request in sorted(self.running, key=lambda r: r.id):
            if request not in self.running:
                continue  # preempted to make room for an older request
            unscheduled = [r for r in self._holders() if all(r is not c for c, _ in chunks)]
            if not self._make_room(request, request.num_cached + 1, victims=unscheduled):
                self._preempt(request)
                continue
            chunks.append((request, self._chunk(request, 1)))
            budget -= 1
        while self.waiting and budget > 0 and len(chunks) < self.config.max_num_seqs:
            request = self.waiting[0]
            n = min(len(request.tokens) - request.num_cached, budget)
            if not self._make_room(request, request.num_cached + n, victims=list(self.waiting)[1:]):
                break
            chunks.append((request, self._chunk(request, n)))
            budget -= n
            if request.num_cached + n == len(request.tokens):
                self.running.append(self.waiting.popleft())
        return chunks

    def _holders(self) -> list[Request]:
        return self.running + [r for r in self.waiting if r.pages]

    def _make_room(self, request: Request, num_tokens: int, victims: list[Request]) -> bool:
        """Grows `request`'s pages to hold `num_tokens`, preempting the newest of `victims` as needed."""
        victims = sorted((v for v in victims if v is not request and v.pages), key=lambda r: r.id)
        while not self.pool.can_allocate(self.pool.pages_for(num_tokens) - len(request.pages)):
            if not victims:
                return False
            self._preempt(victims.pop())
        self.pool.grow(request.pages, num_tokens)
        return True

    def _preempt(self, request: Request) -> None:
        """Frees a request's pages; it is recomputed from its prompt and output later."""
        self.pool.deallocate(request.pages)
        request.pages, request.num_cached = [], 0
        if request in self.running:
            self.running.remove(request)
            self.waiting.appendleft(request)

    def _chunk(self, request: Request, n: int) -> SeqChunk:
        start = request.num_cached
        return SeqChunk(request.tokens[start:start + n], start, list(request.pages), request.wants_all_logits)

    def _consume(self, chunks: list[tuple[Request, SeqChunk]], logits: torch.Tensor) -> StepResult:
        rows, finished, row = {}, [], 0
        for request, chunk in chunks:
            n = len(chunk.tokens) if chunk.wants_all_logits else 1
            rows[request.id] = logits[row:row + n]
            row += n
            request.num_cached += len(chunk.tokens)
            if request.num_cached < len(request.tokens):
                continue  # more prompt to prefill
            request.output.append(sample(logits[row - 1], request.params, request.generator))
            request.finish_reason = self._finish_reason(request)
            if request.finish_reason:
                self.running.remove(request)
                self.pool.deallocate(request.pages)
                request.pages = []
                finished.append(request)
        return StepResult(rows, finished)

    def _finish_reason(self, request: Request) -> str | None:
        last = request.output[-1]
        if last in request.params.stop_token_ids or (last in self.eos_token_ids and not request.params.ignore_eos):
            return "stop"
        if len(request.output) >= request.params.max_tokens:
            return "length"
        return None
