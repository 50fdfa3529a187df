"""Rendering the megakernel's Triton source from the template and a typed context built here.

The template only loops and substitutes: which task kinds the model uses, the body calls with their
compile-time arguments, and the layout's offsets are all decided in Python.
"""
from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import jinja2
import triton

from codegen.bodies import OUTLINE_GROUPS
from codegen.kernel_abi import KERNEL_NAME
from codegen.layout import CONTROL_FIELDS, PARK_WORDS, STEP_LOG, STEP_REGIONS
from codegen.lower import Lowering, even_chunks, even_columns, even_heads, qkv_block_k, sample_splits, sample_wide
from codegen.tasks import (CLAIM, DESC_WORDS, FLAGS, GROUP_SIZE, GROUP_START, MAX_WAITS, NEXT, PREFILL_ONLY,
                           STREAM_ONLY, STREAMS, TASK_WORDS, Kind)

TEMPLATES = Path(__file__).parent / "templates"


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def window(keys: int, block_kv: int) -> int:
    """Attention's window in key blocks of `block_kv`: as many as hold `keys` keys, at least one."""
    return max(1, keys // block_kv)


def _dispatch(lw: Lowering, dot_f32: bool) -> list[tuple[int, str]]:
    cfg, c, r = lw.config, lw.constants, SimpleNamespace(**{k: lw.layout.offset(k) for k in STEP_REGIONS})
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    bk_small = qkv_block_k(lw)  # qkv tiles are [head_dim, bk]: keep them in registers
    bk_rows = max(16, min(256, bk // 2))  # few-row dots stage inputs as large as their weights: smaller chunks
    hdp = _pow2(max(16, c.get("HEAD_DIM_MAX", 16)))
    prefill_bk = cfg.prefill_block_k or cfg.block_k_dot
    # the pointer tiles' K loops take no K mask where every chunk they cut is whole
    even_k = even_chunks(lw, max(bk_small, bk_rows, cfg.block_k_dot, prefill_bk, cfg.qkv_batch_k))
    even_n = even_columns(lw, max(cfg.block_n, cfg.batch_n, cfg.whole_batch_n, cfg.wide_n))
    streamed = "tickets:stream" in lw.layout.regions
    stream_out = lw.layout.offset("stream_out") if streamed else -1
    stream_parts = lw.layout.offset("stream_parts") if streamed else -1
    stream_tickets = lw.layout.offset("tickets:stream") if streamed else -1
    full_rotary = hdp == c.get("HEAD_DIM_MAX") and not c.get("PARTIAL_ROTARY")  # rotary over the whole padded head
    decode_bkv = c.get("DECODE_BLOCK_KV", cfg.block_kv)
    vocab = lw.graph.outputs["logits"].shape[1]
    sample_block = min(1024, _pow2(-(-vocab // sample_splits(lw))))  # logits per iteration of a chunk's loop
    rows_gemv = cfg.rows_gemv if cfg.rows_max > 1 else 0  # (no step of 2 rows or more takes `linear_rows`)
    calls = {
        Kind.LINEAR: f"linear_task(desc, tile, parts, W, ACT, F32, I32, num_tokens, num_seqs, {bm}, {bn}, {bk}, "
                     f"{bk_rows}, {cfg.wide_rows}, {cfg.prefill_rows}, {cfg.wide_n}, {cfg.batch_n}, "
                     f"{cfg.whole_batch_n or cfg.batch_n}, {cfg.block_k_dot}, {dot_f32}, "
                     f"{cfg.num_stages}, {cfg.batch_stages}, {cfg.prefill_stages}, {cfg.batch_tma}, {cfg.prefill_tma}, "
                     f"{c.get('PREFILL_PARTS', 0)}, {cfg.prefill_splits}, {rows_gemv}, "
                     f"{cfg.rows_stages or cfg.num_stages}, {cfg.rows_max}, {prefill_bk}, {stream_out}, "
                     f"{stream_parts}, {stream_tickets}, {cfg.stream_block_k if streamed else 0}, "
                     f"{cfg.stream_stages}, {cfg.stream_tiles}, {cfg.stream_whole_kb * 1024}, "
                     f"{cfg.prefill_claimed_part}, {even_k}, {even_n}, "
                     f"{bool(c.get('PREFILL_ONLY_LINEARS'))})" + (
                         # (a router that routes a decode step itself: `router_routes`, after its task)
                         f"; router_routes(desc, tile, ACT, F32, I32, num_tokens, num_seqs, {bn}, "
                         f"{_pow2(c.get('NUM_EXPERTS_MAX', 1))}, {_pow2(c.get('TOP_K_MAX', 1))})"
                         if c.get("ROUTE_IN_ROUTER") else ""),
        Kind.QKV: f"qkv_task(desc, tile, W, ACT, F32, I32, KV, kv_plane, num_tokens, {r.positions}, {r.slots}, "
                  f"{bm}, {cfg.wide_rows}, {cfg.qkv_block_m}, {bk_small}, {cfg.qkv_batch_k}, {hdp}, {dot_f32}, "
                  f"{cfg.num_stages}, {full_rotary}, {prefill_bk}, {cfg.prefill_stages}, {cfg.prefill_tma}, {even_k}, "
                  f"{even_heads(lw, hdp)}, {cfg.qkv_prefill_rows})",
        Kind.ATTENTION: f"attention_task(desc, tile, ACT, F32, I32, KV, kv_plane, num_tokens, num_seqs, "
                        f"{r.seq_starts}, {r.context_lens}, {r.seq_req}, {r.req_pages}, {cfg.max_pages_per_seq}, "
                        f"{cfg.page_size}, {_pow2(cfg.max_batch)}, {bm}, {cfg.attention_block_m}, {cfg.block_kv}, "
                        f"{decode_bkv}, "
                        f"{hdp}, {dot_f32}, {cfg.attention_stages}, {cfg.merge_stages}, "
                        f"{_pow2(c.get('ATTENTION_SPLITS_MAX', 1))}, {window(cfg.decode_window_keys, decode_bkv)}, "
                        f"{window(cfg.prefill_window_keys, cfg.block_kv)}, {cfg.attention_bf16_scores}, "
                        f"{even_heads(lw, hdp)})",
        # the embedding's tasks take the step's rows 4 * block_m at a time: each loads 32 bytes of a row, and a
        # prefill's rows came a trip to memory a block (H200, prefill embedding of 512 / 2,048 tokens 44 / 155 us
        # in 16-row blocks, 16 / 49 in 64)
        Kind.EMBED: f"embed_task(desc, tile, W, ACT, F32, I32, num_tokens, {r.input_ids}, {4 * bm}, {bn})",
        Kind.GATHER: f"gather_task(desc, tile, ACT, F32, I32, num_seqs, {r.logits_rows}, {bm}, {bn})",
        Kind.RMS_NORM: f"rms_norm_task(desc, tile, W, ACT, F32, num_tokens, num_seqs, {bm}, {bn})",
        Kind.ADD: f"add_task(desc, tile, ACT, F32, num_tokens, num_seqs, {bm}, {bn})",
        Kind.ROUTE: f"route_task(desc, tile, ACT, F32, I32, num_tokens, num_seqs, {bm}, "
                    f"{_pow2(c.get('NUM_EXPERTS_MAX', 1))}, {_pow2(c.get('TOP_K_MAX', 1))}, {cfg.route_loop_rows}, "
                    f"{bool(c.get('ROUTE_IN_ROUTER'))})",
        # an expert's prefill blocks at most 3 stages deep: within the shared memory a kernel's prefill tiles take
        # (its total did not move at 64 or 128 rows, H200, Qwen3-30B-A3B)
        Kind.EXPERT: f"expert_task(desc, tile, W, ACT, F32, I32, num_tokens, num_seqs, {bm}, "
                     f"{cfg.expert_prefill_rows}, {cfg.expert_tail_rows}, {cfg.expert_block_n}, "
                     f"{max(cfg.expert_prefill_n, cfg.expert_block_n)}, {cfg.expert_block_k}, "
                     f"{_pow2(c.get('NUM_EXPERTS_MAX', 1))}, {dot_f32}, {cfg.expert_stages}, "
                     f"{min(cfg.expert_stages, 3)}, {cfg.expert_gemv}, {cfg.target_programs}, {cfg.expert_claims}, "
                     f"{cfg.combines_in_down}, {c.get('TOP_K_MAX', 1)})",
        # a prefill's combine in [64, 64] blocks over every task (`combine_task`)
        Kind.COMBINE: f"combine_task(desc, tile, ACT, F32, num_tokens, num_seqs, {bm}, {bn}, 64, 64, "
                      f"{c.get('TOP_K_MAX', 1)}, {cfg.combines_in_down})",
        Kind.SAMPLE: f"sample_task(desc, tile, I32, F32, num_seqs, step, {lw.layout.offset('control')}, "
                     f"{r.seq_req}, {r.seq_final}, {r.req_num_out}, {r.req_max_tokens}, {r.req_finished}, "
                     f"{r.req_last}, {r.req_seed}, {r.req_top_k}, {r.req_ignore_eos}, "
                     f"{lw.layout.offset('req_temperature')}, {lw.layout.offset('req_top_p')}, {r.out_tokens}, "
                     f"{cfg.max_new_tokens}, {r.eos_ids}, {sample_block}, {sample_wide(lw)})",
    }
    used = sorted({t.kind for t in lw.tasks.tasks})
    return [(int(kind), calls[kind]) for kind in used]


BODY_MODULES = ("common", "sync", "schedule", "linear", "qkv", "attention", "rows", "moe")
BODIES = Path(__file__).parent / "bodies"


# the worker loop's state kept across a task body (name, an int64 stored as int32), parked when park_state
PARKED = (("claim", False), ("group", False), ("group_size", False), ("pending", False), ("signal", False),
          ("kind", True), ("desc_index", True), ("next_t", False), ("next_kind", True), ("next_desc", True),
          ("next_tile", True), ("next_next", False), ("resume", False), ("flags", False), ("step", False),
          ("t", False), ("ok", False))
PARKED_STREAMS = (("parts", False), ("share", False))  # ... and where some group streams (`gemv_stream`)


def outline(source: str, groups: str) -> str:
    """`source` with the functions of the comma-separated `groups` compiled as functions of their own."""
    for group in filter(None, groups.split(",")):
        for fn in OUTLINE_GROUPS[group]:
            head = f"@triton.jit\ndef {fn}("
            if head not in source:
                raise ValueError(f"outline group {group}: no plain @triton.jit function {fn}() in the bodies")
            source = source.replace(head, f"@triton.jit(noinline=True)\ndef {fn}(")
    return source


@functools.cache
def inline_bodies(directory: Path = BODIES) -> str:
    """The task bodies' source (of `directory`'s modules), inlined so that the artifact's kernel source stands
    alone (and its hash, the compile-cache key, covers every line of code that runs). Read once a process, as
    the compile cache's key reads the compiler's source (`blinkc.compile_model._compiler_digest`)."""
    parts, defined = [], {}
    for name in BODY_MODULES:
        lines = [line for line in (directory / f"{name}.py").read_text().splitlines()
                 if not line.startswith(("import ", "from "))]
        for line in lines:  # one namespace once inlined: a second definition would silently win
            if line.startswith("def "):
                fn = line[4:].split("(")[0]
                if fn in defined:
                    raise ValueError(f"task bodies {defined[fn]} and {name} both define {fn}()")
                defined[fn] = name
        parts.append(f"# ---- codegen/bodies/{name}.py\n" + "\n".join(lines).strip() + "\n")
    return "\n\n".join(parts)


@functools.cache
def kernel_template() -> jinja2.Template:
    """The kernel's jinja2 template, read once a process (as `inline_bodies` and the compile cache's key read
    theirs: a template edited while a process runs does not mix into that process's builds)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, auto_reload=False)
    return env.get_template("megakernel.py.j2")


def render_kernel(lw: Lowering, model_name: str) -> str:
    cfg = lw.config
    regions = {k: lw.layout.offset(k) for k in (*STEP_REGIONS, "control")}
    streams = "tickets:stream" in lw.layout.regions
    sample = lw.sample
    context = dict(
        model_name=model_name, kernel_name=KERNEL_NAME, bodies=outline(inline_bodies(), cfg.outline),
        r=SimpleNamespace(**regions), dispatch=_dispatch(lw, cfg.interpret),
        sample_event=sample.event, num_sample_tasks=sample.count, plan_event=lw.plan_event,
        spin_limit=cfg.spin_limit, pages_per_seq=cfg.max_pages_per_seq, page_size=cfg.page_size,
        max_tokens_per_step=cfg.max_tokens_per_step, stats_off=lw.constants["STATS_OFF"],
        stats_size=lw.constants["STATS_SIZE"], chunk=128, requests=_pow2(cfg.max_batch), task_words=TASK_WORDS,
        desc_words=DESC_WORDS, max_waits=MAX_WAITS, profile=cfg.profile and not cfg.interpret,
        profile_step=cfg.profile_step,
        prefetch=not cfg.interpret,  # inline PTX: the interpreter cannot run it
        exact_norm_sums=cfg.exact_norm_sums, epilogue_tma=cfg.epilogue_tma, gated_tma=cfg.gated_tma,
        attention_step_keys=cfg.attention_step_keys,
        inline_ptx=not cfg.interpret,
        poll_loads=(1 if cfg.interpret else 2) if cfg.poll_loads else 0,  # (the interpreter has no fence: inline PTX)
        # a kernel whose decode steps have no more rows than a slice keeps the last split finishing each block
        split_slice_rows=cfg.split_slice_rows if cfg.max_batch > cfg.split_slice_rows else 0,
        narrow_rows=cfg.narrow_batch_rows if cfg.narrow_batch_rows < cfg.wide_rows else 0,
        short_prefill=cfg.short_prefill,
        timer=not cfg.interpret,  # the global timer is inline PTX too: GPU builds log each step's start
        step_log=STEP_LOG, dynamic=cfg.dynamic_tasks,
        ctl=SimpleNamespace(**{name: index for index, name in enumerate(CONTROL_FIELDS)}),
        words=SimpleNamespace(next=NEXT, claim=CLAIM, group_start=GROUP_START, group_size=GROUP_SIZE,
                              flags=FLAGS, prefill_only=PREFILL_ONLY, streams=STREAMS,
                              stream_only=STREAM_ONLY),
        park=cfg.park_state and not cfg.dynamic_tasks, park_off=lw.layout.offset("park"), park_words=PARK_WORDS,
        parked=PARKED + (PARKED_STREAMS if streams else ()), streams=streams,
    )
    return kernel_template().render(**context)
