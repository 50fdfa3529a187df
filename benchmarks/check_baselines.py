"""Measures the decode benchmark's baselines on one GPU in one call and prints a short table last.

    PYTHONPATH=. timeout 470 python benchmarks/check_baselines.py         # on the GPU machine
    PYTHONPATH=. python benchmarks/check_baselines.py --tiny              # tiny configs on the CPU (eager)

Llama-3-8B: read bandwidth, roofline at batch 1 context 512, torch decode in one CUDA graph at batch
1/8/32/64 x context 512/4096 (each with its share of the read bandwidth), eager decode at batch 1 context
512, prefill of 128/512/2048 tokens; then Qwen3-30B-A3B decode at batch 1 and 8 if its 61 GB fit once the
Llama weights are freed. Everything runs inside a time budget and stops cleanly before it runs out; the
full log goes to $OUT/baselines.log (or ./baselines.log).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend

from benchmarks.baselines import (DoesNotFit, ModelWeights, capture_graph, decode_bytes_per_step, make_decode_step,
                                  random_weights, read_bandwidth_tbs, release_memory, torch_decode_eager_ms,
                                  torch_decode_ms, torch_prefill_ms)
from models.config import ModelConfig
from models.registry import resolve_model

BUDGET_S = 420.0  # the device call allows 480 s; leave room for start-up and the table


@dataclass(frozen=True)
class Plan:
    device: str
    dense_model: str
    moe_model: str
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    prefill_lens: tuple[int, ...]
    moe_batches: tuple[int, ...]
    bandwidth_bytes: int


GPU_PLAN = Plan("cuda", "llama3-8b", "qwen3-30b-a3b", (1, 8, 32, 64), (512, 4096), (128, 512, 2048), (1, 8),
                4_000_000_000)
TINY_PLAN = Plan("cpu", "tiny-llama", "tiny-qwen3-moe", (1, 8), (32, 96), (16, 64), (1, 8), 64_000_000)


@dataclass
class Row:
    what: str
    ms: float | None = None
    pct_bw: float | None = None
    note: str = ""


class Report:
    """Lines go to stdout and the log as they happen; the table is printed last."""

    def __init__(self, log_path: Path) -> None:
        self.log = log_path.open("w")
        self.rows: list[Row] = []

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def add(self, row: Row) -> None:
        self.rows.append(row)
        ms = "" if row.ms is None else f"{row.ms:.3f} ms"
        pct = "" if row.pct_bw is None else f"{row.pct_bw:.1f}% of read BW"
        self.say(f"RESULT {row.what}: {ms} {pct} {row.note}".rstrip())

    def table(self, title: str) -> None:
        self.say("")
        self.say(title)
        self.say(f"| {'what':44s} | {'ms':>9s} | {'% read BW':>9s} | note")
        self.say(f"|{'-' * 46}|{'-' * 11}|{'-' * 11}|------")
        for row in self.rows:
            ms = "-" if row.ms is None else f"{row.ms:.3f}"
            pct = "-" if row.pct_bw is None else f"{row.pct_bw:.1f}%"
            self.say(f"| {row.what:44s} | {ms:>9s} | {pct:>9s} | {row.note}")


class Bench:
    """Runs one measurement at a time within the budget and records it, or why it was skipped."""

    def __init__(self, report: Report, device: torch.device, budget_s: float) -> None:
        self.report, self.device = report, device
        self.deadline = time.monotonic() + budget_s
        self.bandwidth_tbs: float | None = None

    def check(self, what: str, checked: Callable[[], str], *, needs_s: float) -> None:
        """Runs a check whose result is a line for the log (not a row of the table)."""
        if self.seconds_left() < needs_s:
            self.report.say(f"CHECK {what}: skipped, time budget")
            return
        try:
            self.report.say(f"CHECK {what}: {checked()}")
        except Exception as err:  # noqa: BLE001 -- as in measure
            self.report.say(traceback.format_exc())
            self.report.say(f"CHECK {what}: FAILED: {type(err).__name__}: {err}")
        finally:
            release_memory(self.device)

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def measure(self, what: str, timed: Callable[[], float], *, needs_s: float, num_bytes: int | None = None,
                note: str = "", describe: Callable[[float], str] | None = None) -> float | None:
        if self.seconds_left() < needs_s:
            left = self.seconds_left()
            self.report.add(Row(what, note=f"skipped: {left:.0f} s of the budget left, needs ~{needs_s:.0f}"))
            return None
        start = time.monotonic()
        try:
            ms = timed()
        except DoesNotFit as err:
            self.report.add(Row(what, note=f"skipped, does not fit: {err}"))
            return None
        except Exception as err:  # noqa: BLE001 -- one failed row must not cost the whole single-shot run
            self.report.say(traceback.format_exc())
            self.report.add(Row(what, note=f"FAILED: {type(err).__name__}: {str(err)[:120]}"))
            return None
        finally:
            release_memory(self.device)
        pct = None
        if num_bytes is not None and self.bandwidth_tbs:
            pct = 100 * num_bytes / (ms * 1e-3) / (self.bandwidth_tbs * 1e12)
        note = f"{note} {describe(ms)}".strip() if describe else note
        self.report.say(f"  ({what}: {time.monotonic() - start:.1f} s including set-up)")
        self.report.add(Row(what, ms, pct, note))
        return ms


def describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        return f"cpu, torch {torch.__version__}, triton {triton.__version__}"
    props = torch.cuda.get_device_properties(device)
    free, total = torch.cuda.mem_get_info(device)
    return (f"{props.name}, {props.multi_processor_count} SMs, {total / 2**30:.1f} GiB ({free / 2**30:.1f} free), "
            f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}")


def decode_timer(bench: Bench) -> Callable[..., float]:
    """CUDA-graph decode on a GPU; on a CPU (the --tiny dry run) eager, since there is no graph to capture."""
    return torch_decode_ms if bench.device.type == "cuda" else torch_decode_eager_ms


def graph_vs_eager_error(cfg: ModelConfig, weights: ModelWeights, device: torch.device) -> str:
    """The graph's replayed logits against an eager run of the same step (batch 1, context 512)."""
    with torch.inference_mode():
        step = make_decode_step(cfg, 1, 512, device, weights)
        eager = step().clone()
        graph, replayed = capture_graph(step)
        replayed.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(device)
        err = ((replayed - eager).norm() / eager.norm()).item()
    return f"graph vs eager logits rel err {err:.1e}, finite: {bool(replayed.isfinite().all())}"


def sdpa_gqa_error(cfg: ModelConfig, device: torch.device) -> str:
    """SDPA with enable_gqa=True against fp32 SDPA on repeated kv heads, at the decode and a prefill shape,
    and the backend SDPA picks for each."""
    backends = {backend.value: name for name, backend in SDPBackend.__members__.items()}
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    rep = heads // kv_heads
    parts = []
    for q_len, kv_len in ((1, 513), (128, 128)):
        def rand(num_heads: int, length: int) -> torch.Tensor:
            return torch.randn(1, num_heads, length, cfg.head_dim, device=device, dtype=cfg.dtype.torch)
        q, k, v = rand(heads, q_len), rand(kv_heads, kv_len), rand(kv_heads, kv_len)
        causal = q_len > 1
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        expected = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(rep, 1),
                                                  v.float().repeat_interleave(rep, 1), is_causal=causal)
        err = ((out.float() - expected).norm() / expected.norm()).item()
        choice = torch._fused_sdp_choice(q, k, v, is_causal=causal, enable_gqa=True)
        parts.append(f"q{q_len}/kv{kv_len} rel err {err:.1e} via {backends.get(choice, choice)}")
    return "; ".join(parts)


def top_kernels(cfg: ModelConfig, weights: ModelWeights, device: torch.device, *, num_rows: int = 15) -> str:
    """Where one graph replay of decode (batch 1, context 512) spends its time, kernel by kernel."""
    with torch.inference_mode():
        graph, _ = capture_graph(make_decode_step(cfg, 1, 512, device, weights))
        graph.replay()
        torch.cuda.synchronize(device)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize(device)
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=num_rows, max_name_column_width=70)
    return "3 replays profiled\n" + table


def run_dense(bench: Bench, plan: Plan) -> None:
    cfg = resolve_model(plan.dense_model).config
    roofline_bytes = decode_bytes_per_step(cfg, 1, plan.decode_contexts[0])
    roofline_ms = roofline_bytes / (bench.bandwidth_tbs * 1e9)
    bench.report.add(Row(f"{plan.dense_model} roofline b1 ctx{plan.decode_contexts[0]}", roofline_ms, 100.0,
                         f"{roofline_bytes / 1e9:.2f} GB per step"))
    weights = random_weights(cfg, bench.device)
    if bench.device.type == "cuda":
        bench.check("sdpa gqa", lambda: sdpa_gqa_error(cfg, bench.device), needs_s=10)
        bench.check("graph replay", lambda: graph_vs_eager_error(cfg, weights, bench.device), needs_s=20)
    decode = decode_timer(bench)
    kind = "graph" if bench.device.type == "cuda" else "eager"
    for context in plan.decode_contexts:
        for batch in plan.decode_batches:
            num_bytes = decode_bytes_per_step(cfg, batch, context)
            bench.measure(f"{plan.dense_model} torch {kind} decode b{batch} ctx{context}",
                          lambda: decode(cfg, batch, context, bench.device, weights=weights),
                          needs_s=20, num_bytes=num_bytes, note=f"{num_bytes / 1e9:.2f} GB")
    context = plan.decode_contexts[0]
    bench.measure(f"{plan.dense_model} torch eager decode b1 ctx{context}",
                  lambda: torch_decode_eager_ms(cfg, 1, context, bench.device, weights=weights),
                  needs_s=20, num_bytes=decode_bytes_per_step(cfg, 1, context), note="launched op by op")
    prefill = "graph" if bench.device.type == "cuda" else "eager"
    for prompt_len in plan.prefill_lens:
        bench.measure(f"{plan.dense_model} torch {prefill} prefill {prompt_len} tok", needs_s=20,
                      timed=lambda: torch_prefill_ms(cfg, prompt_len, bench.device, weights=weights),
                      describe=lambda ms: f"TTFT; {prompt_len / ms * 1e3:,.0f} tokens/s")


def run_moe(bench: Bench, plan: Plan) -> None:
    cfg = resolve_model(plan.moe_model).config
    if bench.seconds_left() < 60:
        bench.report.add(Row(f"{plan.moe_model} decode", note="skipped: time budget"))
        return
    try:
        weights = random_weights(cfg, bench.device)
    except DoesNotFit as err:
        bench.report.add(Row(f"{plan.moe_model} decode", note=f"skipped, weights do not fit: {err}"))
        return
    decode = decode_timer(bench)
    kind = "graph" if bench.device.type == "cuda" else "eager"
    context = plan.decode_contexts[0]
    for batch in plan.moe_batches:
        num_bytes = decode_bytes_per_step(cfg, batch, context)
        bench.measure(f"{plan.moe_model} torch {kind} decode b{batch} ctx{context}",
                      lambda: decode(cfg, batch, context, bench.device, weights=weights),
                      needs_s=30, num_bytes=num_bytes, note=f"{num_bytes / 1e9:.2f} GB (if all routed experts differ)")


def run_profile(bench: Bench, plan: Plan) -> None:
    """Last, so that a profiler problem cannot cost any figure: the kernels of one dense decode step."""
    if bench.device.type != "cuda" or bench.seconds_left() < 40:
        return
    cfg = resolve_model(plan.dense_model).config
    weights = random_weights(cfg, bench.device)
    bench.check("kernels of one decode step", lambda: top_kernels(cfg, weights, bench.device), needs_s=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU: a dry run of this script")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    args = parser.parse_args(argv)
    plan = TINY_PLAN if args.tiny else GPU_PLAN
    if plan.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or pass --tiny for a CPU dry run", file=sys.stderr)
        return 1
    device = torch.device(plan.device)
    report = Report(Path(os.environ.get("OUT", ".")) / "baselines.log")
    bench = Bench(report, device, args.budget_s)
    title = f"device: {describe_device(device)}"
    report.say(title)
    bench.bandwidth_tbs = read_bandwidth_tbs(device, num_bytes=plan.bandwidth_bytes)
    report.add(Row("read bandwidth (torch.sum, bf16)",
                   note=f"{bench.bandwidth_tbs:.3f} TB/s over {plan.bandwidth_bytes / 1e9:g} GB"))
    run_dense(bench, plan)  # its weights are freed on return, before the MoE model's are made
    release_memory(device)
    run_moe(bench, plan)
    release_memory(device)
    run_profile(bench, plan)
    report.table(title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
