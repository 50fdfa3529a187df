"""Before any code is generated: the schedule check on hand-built and lowered task graphs, the compile
config's own checks, the memory layout, and the rendered kernel source."""
from __future__ import annotations

import ast
import dataclasses
import json

import pytest
import torch

from blinkc.build import build_graph
from codegen.check import ScheduleError, check_schedule, check_shared_activations
from codegen.bodies.linear import LINEAR_FIELDS
from codegen.bodies.moe import COMBINE_FIELDS, EXPERT_FIELDS, ROUTE_FIELDS
from codegen.config import CompileConfig
from codegen.layout import ALIGN, Layout
from codegen.lower import lower
from codegen.render import BODY_MODULES, KERNEL_NAME, render_kernel
from codegen.tasks import (CLAIM, DESC_WORDS, FLAGS, GROUP_SIZE, GROUP_START, NEXT, PREFILL_ONLY, STREAM_ONLY, STREAMS,
                           TASK_WORDS, Kind, Task, TaskGraph, Wait, schedule)
from ir.passes.pipeline import PIPELINE, run_pipeline
from models.registry import resolve_model
from models.trace import trace_model

CONFIG = CompileConfig(max_batch=3, max_tokens_per_step=16, max_model_len=48, max_new_tokens=8, page_size=4,
                       interpret=True)
MOE_CALLS = {"route_task", "expert_task", "combine_task"}


def _graph() -> tuple[TaskGraph, int]:
    """An empty task graph with the planner's event (signalled by the kernel, never by a task) and a desc."""
    graph = TaskGraph()
    graph.new_event("plan")
    return graph, graph.add_desc(("x",), {"x": 0})


def _chain(graph: TaskGraph, desc: int) -> tuple[Wait, Wait]:
    """embed (2 tiles) -> linear (3 tiles): returns both groups' waits."""
    embed = graph.add_group(Kind.EMBED, desc, 2, "embed", ())
    return embed, graph.add_group(Kind.LINEAR, desc, 3, "linear", (embed,))


def _lowered(preset: str, config: CompileConfig = CONFIG):
    return lower(build_graph(resolve_model(preset), config), config)


# -- check_schedule on hand-built graphs ---------------------------------------------------------------------
def test_a_chain_that_ends_in_sampling_passes():
    graph, desc = _graph()
    _, linear = _chain(graph, desc)
    check_schedule(graph, graph.add_group(Kind.SAMPLE, desc, 2, "sample", (linear,)))


def test_a_wait_on_an_event_no_task_signals_is_rejected():
    graph, desc = _graph()
    orphan = graph.new_event("orphan")
    _, linear = _chain(graph, desc)
    sample = graph.add_group(Kind.SAMPLE, desc, 1, "sample", (linear, Wait(orphan, 1)))
    with pytest.raises(ScheduleError, match=r"task 5 \(SAMPLE\) waits on event 1 \(orphan\), which no task signals"):
        check_schedule(graph, sample)


def test_a_wait_counting_other_than_its_signalling_tasks_is_rejected():
    graph, desc = _graph()
    embed, _ = _chain(graph, desc)
    sample = graph.add_group(Kind.SAMPLE, desc, 1, "sample", (Wait(embed.event, embed.count + 1),))
    with pytest.raises(ScheduleError, match=r"\(embed\) for 3 signals per step; 2 tasks signal it"):
        check_schedule(graph, sample)


def test_a_same_step_wait_on_a_later_task_is_rejected():
    graph, desc = _graph()
    first, second, sample = graph.new_event("first"), graph.new_event("second"), graph.new_event("sample")
    graph.tasks += [Task(Kind.LINEAR, desc, 0, first, (Wait(second, 1),)),
                    Task(Kind.LINEAR, desc, 0, second, (Wait(first, 1),)),
                    Task(Kind.SAMPLE, desc, 0, sample, (Wait(second, 1),))]
    with pytest.raises(ScheduleError, match=r"task 0 \(LINEAR\) waits on event 2 \(second\), signalled by a later "
                                            r"task 1: not runnable in order"):
        check_schedule(graph, Wait(sample, 1))


def test_a_wait_on_the_previous_steps_signals_of_a_later_task_passes():
    graph, desc = _graph()
    first, second, sample = graph.new_event("first"), graph.new_event("second"), graph.new_event("sample")
    graph.tasks += [Task(Kind.LINEAR, desc, 0, first, (Wait(second, 1, lag=1),)),
                    Task(Kind.LINEAR, desc, 0, second, (Wait(first, 1),)),
                    Task(Kind.SAMPLE, desc, 0, sample, (Wait(second, 1),))]
    check_schedule(graph, Wait(sample, 1))


def test_a_group_that_does_not_lead_to_sampling_is_rejected():
    graph, desc = _graph()
    embed, linear = _chain(graph, desc)
    graph.add_group(Kind.ADD, desc, 1, "stray", (embed,))
    sample = graph.add_group(Kind.SAMPLE, desc, 1, "sample", (linear,))
    with pytest.raises(ScheduleError, match=r"groups \['stray'\] do not lead to sampling"):
        check_schedule(graph, sample)


def test_a_group_read_only_by_the_next_step_does_not_lead_to_sampling():
    graph, desc = _graph()
    early = graph.add_group(Kind.EMBED, desc, 1, "early", ())
    late = graph.add_group(Kind.LINEAR, desc, 1, "late", (Wait(early.event, early.count, lag=1),))
    sample = graph.add_group(Kind.SAMPLE, desc, 1, "sample", (late,))
    with pytest.raises(ScheduleError, match=r"groups \['early'\] do not lead to sampling"):
        check_schedule(graph, sample)


# -- lowering real models ----------------------------------------------------------------------------------
def test_a_lowered_moe_model_passes_the_schedule_check():
    lw = _lowered("tiny-qwen3-moe")
    check_schedule(lw.tasks, lw.sample)
    kinds = {t.kind for t in lw.tasks.tasks}
    assert {Kind.ROUTE, Kind.EXPERT, Kind.COMBINE, Kind.SAMPLE} <= kinds
    assert lw.sample.count == CONFIG.max_batch


def test_routing_counts_are_zeroed_every_step_and_decode_tokens_route_a_task_each():
    """Each routed pair takes its place in its expert's list from a count the planner zeroes every step; a
    decode step's tokens route on tasks of their own, and the tasks past max_batch only work in prefills."""
    lw = _lowered("tiny-qwen3-moe")
    zeroed = range(lw.constants["STATS_OFF"], lw.constants["STATS_OFF"] + lw.constants["STATS_SIZE"])
    routes = [t for t in lw.tasks.tasks if t.kind == Kind.ROUTE]
    descs = {t.desc for t in routes}
    assert len(descs) == 2  # the two MoE layers
    for d in descs:
        desc = dict(zip(ROUTE_FIELDS, lw.tasks.descs[d]))
        experts = desc["num_experts"]
        assert {desc["counts_off"], desc["counts_off"] + experts} <= set(zeroed)
        assert desc["capacity"] == CONFIG.max_tokens_per_step
        assert desc["num_tasks"] == max(-(-CONFIG.max_tokens_per_step // CONFIG.block_m), CONFIG.max_batch)
        tasks = [t for t in routes if t.desc == d]
        assert [t.prefill_only for t in tasks] == [t.tile >= CONFIG.max_batch for t in tasks]
        assert len(tasks) == desc["num_tasks"]


@pytest.mark.parametrize("fold", [0, 1])
def test_an_moe_layers_norm_is_a_group_or_folded_into_its_experts(fold):
    lw = _lowered("tiny-qwen3-moe", dataclasses.replace(CONFIG, moe_fold_norm=fold))
    norms = [g for g in lw.tasks.event_names if g.endswith(".norm")]
    assert len(norms) == 2 * (1 - fold)  # the two MoE layers'; the routers take the norm in either way
    scaled = {t["param"]: t["scale_columns"] for t in lw.transforms}
    expected = "model.layers.0.post_attention_layernorm.weight" if fold else None
    assert scaled.get("model.layers.0.mlp.experts.gate_up_proj") == expected
    assert scaled["model.layers.0.mlp.gate.weight"] == "model.layers.0.post_attention_layernorm.weight"


def test_norms_fold_into_the_weights_they_feed_and_a_tied_head_gets_its_own_copy():
    lw = _lowered("tiny-phi")  # tied embeddings: the LM head's weight is the embedding table
    graph = lw.graph
    by_param = {t["param"]: t for t in lw.transforms}
    assert len(by_param) == len(lw.transforms)  # each weight transformed once
    head = by_param["model.embed_tokens.weight"]
    assert head["region"].startswith("placed:") and head["scale_columns"] == "model.norm.weight"
    assert lw.layout.offset(head["region"]) != lw.weight(graph.param("model.embed_tokens.weight").value)
    gate_up = [t for t in lw.transforms if "gate_up" in t["param"]]
    assert gate_up and all(t["interleave_rows"] and t["region"] == f"param:{t['param']}" for t in gate_up)
    assert all(t["scale_columns"].endswith("post_attention_layernorm.weight") for t in gate_up)
    qkv = [t for t in lw.transforms if "qkv" in t["param"]]
    assert len(qkv) == resolve_model("tiny-phi").config.num_hidden_layers
    assert not any(t["interleave_rows"] for t in qkv)
    linears = [n for n in graph.nodes if n.op == "fused_linear"]
    assert sum(n.attrs["gated"] for n in linears) == len(gate_up)


def test_lowering_without_the_lowering_prep_passes_names_the_unsupported_ops():
    model = resolve_model("tiny-llama")
    graph = run_pipeline(trace_model(model.definition, model.config, page_size=CONFIG.page_size), PIPELINE)
    with pytest.raises(ValueError, match=r"no lowering for ops \[.*'linear'.*\] \(run the LOWERING_PREP passes"):
        lower(graph, CONFIG)


# -- CompileConfig -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, message", [
    (dict(block_n=24), "block_n must be a power of two, got 24"),
    (dict(block_k=384), "block_k must be a power of two, got 384"),
    (dict(block_kv=48), "block_kv must be a power of two, got 48"),
    (dict(page_size=12), "page_size must be a power of two, got 12"),
    (dict(block_m=8), "block_m, qkv_block_m and attention_block_m must be at least 16"),
    (dict(max_batch=8, max_tokens_per_step=7), "max_tokens_per_step must be at least max_batch"),
    (dict(max_model_len=0), "max_model_len must be positive, got 0"),
    (dict(block_n=0), "block_n must be a power of two, got 0"),
    (dict(outline="rows,gemv"), r"outline: unknown groups \['gemv'\]"),
    (dict(expert_tail_m=48), "expert_tail_m must be a power of two, got 48"),
    (dict(stream_whole_kb=-1), "stream_whole_kb must be at least 0, got -1"),
    (dict(stream_whole_kb=5000), "stream_whole_kb must be at most 4096, got 5000"),
    (dict(qkv_prefill_m=256), "qkv_prefill_m must be 0 or between 16 and 128, got 256"),
])
def test_compile_config_rejects(fields, message):
    with pytest.raises(ValueError, match=message):
        CompileConfig(**fields)


def test_compile_config_accepts_the_edges():
    config = CompileConfig(max_batch=8, max_tokens_per_step=8, max_model_len=33, page_size=16, block_m=16)
    assert config.max_pages_per_seq == 3
    assert config.to_dict()["max_pages_per_seq"] == 3


@pytest.mark.parametrize("fields, tail", [
    (dict(max_tokens_per_step=2048), 64),  # 128-row claimed blocks, 64-row tails
    (dict(max_tokens_per_step=512), 64),  # 64-row blocks: no tails (the blocks' own rows)
    (dict(max_tokens_per_step=2048, expert_tail_m=0), 128),
    (dict(max_tokens_per_step=2048, expert_tail_m=8), 128),  # below block_m: none
    (dict(max_tokens_per_step=512, expert_prefill_m=32, expert_tail_m=16), 16),
])
def test_expert_tails_only_below_the_claimed_blocks_rows(fields, tail):
    assert CompileConfig(**fields).expert_tail_rows == tail


# -- Layout ------------------------------------------------------------------------------------------------
def test_layout_rejects_a_second_allocation_of_one_name():
    layout = Layout()
    layout.alloc("x", "ACT", 10)
    with pytest.raises(ValueError, match="region 'x' allocated twice"):
        layout.alloc("x", "F32", 10)


def test_layout_places_regions_that_share_memory():
    layout = Layout()
    layout.alloc("a", "ACT", 3)
    assert layout.place("b", "ACT", 0, ALIGN + 1) == 0
    assert layout.sizes["ACT"] == 2 * ALIGN
    with pytest.raises(ValueError, match="allocated twice"):
        layout.place("a", "ACT", 0, 1)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe"])
def test_activation_buffers_share_regions_only_when_ordered(preset):
    """The same tasks on shared regions, a fraction of the memory, and every pair of buffers that share memory
    ordered: the later one's writers follow every user of the earlier one (`check_shared_activations`, which
    `lower` runs, is run again here on the result)."""
    graph = build_graph(resolve_model(preset), CONFIG)
    alone = lower(graph, dataclasses.replace(CONFIG, share_activations=False))
    shared = lower(graph, CONFIG)
    assert shared.tasks.tasks == alone.tasks.tasks and shared.act_uses == alone.act_uses
    assert shared.layout.sizes["ACT"] <= alone.layout.sizes["ACT"] // 2
    regions = {name: (shared.layout.offset(name), size) for name, size in shared.act_sizes.items()}
    kept = {f"v{v.id}" for v in graph.outputs.values()}
    check_shared_activations(shared.tasks, regions, shared.act_uses, shared.node_events, kept)
    # no node writes a buffer over one it reads
    for name, uses in shared.act_uses.items():
        start, size = regions[name]
        for other, other_uses in shared.act_uses.items():
            other_start, other_size = regions[other]
            if other != name and uses[0] in other_uses[1:] and start < other_start + other_size and \
                    other_start < start + size:
                raise AssertionError(f"{name} is written over {other}, which its writer reads")


def test_done_before_follows_same_step_waits_only():
    """An event's groups start after everything its waits reach within a step; a lag-1 wait (the step before)
    holds nothing of this step back."""
    graph, desc = _graph()
    embed, linear = _chain(graph, desc)
    side = graph.add_group(Kind.ADD, desc, 1, "side", ())
    late = graph.add_group(Kind.SAMPLE, desc, 1, "late", (linear, Wait(side.event, 1, lag=1)))
    before = graph.done_before()
    assert before[embed.event] == 0 and before[linear.event] == 1 << embed.event
    assert before[late.event] == 1 << embed.event | 1 << linear.event
    assert graph.follows((Wait(late.event, 1),), embed.event) and not graph.follows((Wait(late.event, 1),), side.event)


def test_shared_activations_check_rejects_unordered_sharing():
    """Two buffers moved onto one region: a layer's input and its output (the writer reads the other), and a
    residual still to be read."""
    lowered = _lowered("tiny-llama")
    regions = {name: (lowered.layout.offset(name), size) for name, size in lowered.act_sizes.items()}
    kept = {f"v{v.id}" for v in lowered.graph.outputs.values()}
    first, second = sorted(lowered.act_uses, key=lambda name: lowered.act_uses[name][0])[:2]  # embedding, next
    moved = {**regions, second: regions[first]}
    with pytest.raises(ScheduleError, match=f"{first} and {second} share memory"):
        check_shared_activations(lowered.tasks, moved, lowered.act_uses, lowered.node_events, kept)


def test_layout_offsets_are_aligned_per_arena():
    layout = Layout()
    offsets = [layout.alloc(name, "ACT", size) for name, size in (("a", 1), ("b", ALIGN + 1), ("c", ALIGN), ("d", 3))]
    assert offsets == [0, ALIGN, 3 * ALIGN, 4 * ALIGN]
    assert layout.alloc("e", "I32", 5) == 0
    assert layout.sizes == {"W": 0, "ACT": 5 * ALIGN, "F32": 0, "I32": ALIGN}
    assert layout.regions["b"].size == ALIGN + 1


def test_layout_round_trips_through_json():
    layout = _lowered("tiny-llama").layout
    again = Layout.from_dict(json.loads(json.dumps(layout.to_dict())))
    assert again == layout
    assert again.offset("control") == layout.offset("control")


# -- render ------------------------------------------------------------------------------------------------
def _dispatched_calls(source: str) -> set[str]:
    """The functions the kernel itself calls (the dispatch), not those the inlined bodies define."""
    (kernel,) = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == KERNEL_NAME]
    return {n.func.id for n in ast.walk(kernel) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


@pytest.mark.parametrize("preset, has_moe", [("tiny-llama", False), ("tiny-qwen3-moe", True)])
def test_rendered_source_stands_alone_and_dispatches_only_used_kinds(preset, has_moe):
    source = render_kernel(_lowered(preset), preset)
    tree = ast.parse(source)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert all(isinstance(n, ast.Import) and n.names[0].name.startswith("triton") for n in imports), \
        [ast.unparse(n) for n in imports]
    assert not [line for line in source.splitlines() if line.lstrip().startswith(("from codegen", "import codegen"))]
    for name in BODY_MODULES:
        assert f"# ---- codegen/bodies/{name}.py" in source
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert MOE_CALLS | {"linear_task", "sample_task", KERNEL_NAME} <= defined
    calls = _dispatched_calls(source)
    assert {"linear_task", "qkv_task", "attention_task", "embed_task", "sample_task"} <= calls
    assert (MOE_CALLS <= calls) if has_moe else not (MOE_CALLS & calls)


def test_outlined_bodies_are_compiled_as_functions_of_their_own():
    """Each outline group names plain @triton.jit bodies; outlined, exactly they become noinline (besides the
    helpers that always are)."""
    from codegen.bodies import ALWAYS_OUTLINED, OUTLINE_GROUPS
    from codegen.render import inline_bodies, outline

    def noinline(source):
        tree = ast.parse(source)
        return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                and any("noinline" in ast.unparse(d) for d in n.decorator_list)}

    always = set(ALWAYS_OUTLINED)
    assert noinline(inline_bodies()) == always
    for group, names in OUTLINE_GROUPS.items():
        assert noinline(outline(inline_bodies(), group)) == set(names) | always
    default = render_kernel(_lowered("tiny-llama"), "tiny-llama")  # the default: the GEMV and few-row bodies
    assert noinline(default) == set(OUTLINE_GROUPS["rows"]) | always
    config = dataclasses.replace(CONFIG, outline="rows,small")
    source = render_kernel(lower(build_graph(resolve_model("tiny-llama"), config), config), "tiny-llama")
    assert noinline(source) == set(OUTLINE_GROUPS["rows"] + OUTLINE_GROUPS["small"]) | always


def test_task_bodies_defining_one_name_twice_are_rejected(tmp_path):
    """Inlined into one source, a second definition would silently replace the first."""
    import codegen.render as render

    for name in BODY_MODULES:
        (tmp_path / f"{name}.py").write_text((render.BODIES / f"{name}.py").read_text())
    (tmp_path / "moe.py").write_text((tmp_path / "moe.py").read_text() + "\n\ndef word(desc, index):\n    pass\n")
    with pytest.raises(ValueError, match=r"common and moe both define word\(\)"):
        render.inline_bodies(tmp_path)


def test_the_kernel_template_is_read_once_a_process(tmp_path, monkeypatch):
    """A template edited while a process runs does not reach that process's builds (the compile cache's key was
    taken from the source the process first read)."""
    import codegen.render as render

    (tmp_path / "megakernel.py.j2").write_text("first {{ model_name }}\n")
    monkeypatch.setattr(render, "TEMPLATES", tmp_path)
    render.kernel_template.cache_clear()
    try:
        assert render.kernel_template().render(model_name="m") == "first m\n"
        (tmp_path / "megakernel.py.j2").write_text("edited {{ model_name }}\n")
        assert render.kernel_template().render(model_name="m") == "first m\n"
    finally:
        render.kernel_template.cache_clear()  # the real template for the tests after this one


# -- which program runs which task ---------------------------------------------------------------------------
def test_a_launch_runs_each_groups_first_wave_statically_and_claims_the_rest():
    """Groups of 3, 1, 5 and 1 tasks on 2 programs: task t of a group's first two on program t % 2, in order;
    the 3rd task of the first group and the last 3 of the third are claimed at run time, each group from its
    own counter past the graph's 4 events."""
    table = torch.zeros(10, TASK_WORDS, dtype=torch.int64)
    table[:, 2] = torch.tensor([0, 1, 2, 0, 0, 1, 2, 3, 4, 0])  # tiles: each task's place in its group
    table[:, 3] = torch.tensor([0, 0, 0, 1, 2, 2, 2, 2, 2, 3])
    launch, counters = schedule(table, num_events=4, programs=2)
    assert counters == 2 and launch.shape == (12, TASK_WORDS)
    assert torch.equal(launch[:10, :NEXT], table[:, :NEXT])

    def chain(program):
        t, order = int(launch[10 + program, NEXT]), []
        while t < 10:
            order.append(t)
            t = int(launch[t, NEXT])
        return order

    assert chain(0) == [0, 4] and chain(1) == [1, 3, 5, 9]
    assert launch[:10, CLAIM].tolist() == [4, 4, 4, -1, 5, 5, 5, 5, 5, -1]
    assert launch[:10, GROUP_START].tolist() == [0, 0, 0, 3, 4, 4, 4, 4, 4, 9]
    assert launch[:10, GROUP_SIZE].tolist() == [3, 3, 3, 1, 5, 5, 5, 5, 5, 1]
    table[6, 2] = 7  # a claimed task is known by its place in the group
    with pytest.raises(ValueError, match="not numbered by their place"):
        schedule(table, num_events=4, programs=2)


# -- prefetch and splits -----------------------------------------------------------------------------------
def test_projection_tasks_prefetch_the_first_chunks_of_their_own_weight_rows():
    lw = _lowered("tiny-llama")
    table = lw.tasks.task_table()
    assert table.shape[1] == TASK_WORDS
    (up,) = [n for n in lw.graph.nodes if n.op == "fused_linear" and "layers.0.mlp.gate_up" in n.inputs[1].name]
    w = up.inputs[1]
    n, k, bn, size = w.shape[0], w.shape[1], CONFIG.block_n, w.dtype.itemsize
    tasks = [(i, t) for i, t in enumerate(lw.tasks.tasks)
             if t.kind == Kind.LINEAR and lw.tasks.descs[t.desc][3] == lw.weight(w)]
    assert len(tasks) == -(-n // bn)
    for i, task in tasks:
        p = task.prefetch
        first_row = task.tile * bn
        assert (p.offset, p.stride, p.rows) == (lw.weight(w) + first_row * k, k * size, min(bn, n - first_row))
        assert 16 <= p.row_bytes <= k * size and p.row_bytes % 16 == 0 and p.rows * p.row_bytes <= 32 << 10
        assert table[i, 13:FLAGS].tolist() == [p.offset, p.stride, p.rows, p.row_bytes]
    # attention reads pages the planner assigns at run time: nothing to prefetch
    assert all(t.prefetch.rows == 0 for t in lw.tasks.tasks if t.kind == Kind.ATTENTION)


def test_qkv_split_tasks_prefetch_their_own_k_range():
    config = dataclasses.replace(CONFIG, qkv_splits=3, block_k=16)
    lw = lower(build_graph(resolve_model("tiny-qwen3"), config), config)
    qkv = next(n for n in lw.graph.nodes if n.op == "qkv_rope_store")  # layer 0's: its tasks come first
    k, head_dim = qkv.inputs[0].shape[1], qkv.attrs["head_dim"]
    chunk = -(-(-(-k // 3)) // 16) * 16
    tasks = [t for t in lw.tasks.tasks if t.kind == Kind.QKV][: 3 * 2]  # layer 0, heads 0 and 1
    for task in tasks:
        head, split = divmod(task.tile, 3)
        lo = min(k, split * chunk)
        if lo >= k:
            assert task.prefetch.rows == 0
            continue
        assert task.prefetch.offset == lw.weight(qkv.inputs[1]) + head * head_dim * k + lo
        itemsize = qkv.inputs[1].dtype.itemsize
        assert task.prefetch.rows == head_dim and task.prefetch.row_bytes <= (min(k, lo + chunk) - lo) * itemsize


@pytest.mark.parametrize("max_batch, kv_heads, max_len, expected", [
    (1, 8, 4096, 32),  # one sequence: split its context 32 ways, no more
    (1, 2, 4096, 32),
    (8, 8, 4096, 4),  # ~256 tasks per layer
    (64, 8, 4096, 1),
    (1, 8, 64, 2),  # never shorter than a key block
])
def test_attention_splits_aim_at_about_256_tasks_per_layer(max_batch, kv_heads, max_len, expected):
    from codegen.lower import attention_splits

    config = CompileConfig(max_batch=max_batch, max_model_len=max_len, max_tokens_per_step=256)
    assert attention_splits(config, kv_heads) == expected


@pytest.mark.parametrize("max_batch, max_len, fields, expected", [
    (64, 4136, {}, 64),  # one task a sequence and KV head: 4,136 keys each
    (16, 4136, {}, 64),  # two splits: 2,068 keys each
    (64, 1100, {}, 32),
    (8, 4136, {}, 32),  # four splits: 1,034 keys each
    (1, 4136, {}, 32),
    (64, 4136, {"block_kv": 128}, 128),  # never smaller than the prefill's blocks
    (1, 4136, {"decode_block_kv": 16}, 16),  # as set
])
def test_decode_attention_takes_larger_key_blocks_where_its_tasks_are_long(max_batch, max_len, fields, expected):
    from codegen.lower import decode_block_kv

    config = CompileConfig(max_batch=max_batch, max_model_len=max_len, max_tokens_per_step=256, **fields)
    assert decode_block_kv(config, 8) == expected


@pytest.mark.parametrize("kind", [Kind.ATTENTION, Kind.QKV])
def test_a_prefill_has_a_task_a_program_and_those_past_the_decode_ones_only_prefill(kind):
    from codegen.lower import attention_splits

    config = dataclasses.replace(CONFIG, interpret=False, target_programs=40)
    lw = lower(build_graph(resolve_model("tiny-llama"), config), config)
    first = next(t for t in lw.tasks.tasks if t.kind == kind)
    rows = [i for i, t in enumerate(lw.tasks.tasks) if t.signal == first.signal]
    if kind == Kind.ATTENTION:
        decode = config.max_batch * 2 * attention_splits(config, 2)  # sequences x KV heads x splits: 6
    else:
        from codegen.bodies.qkv import QKV_FIELDS

        desc = dict(zip(QKV_FIELDS, lw.tasks.descs[first.desc]))
        decode = (desc["num_q_heads"] + 2 * desc["num_kv_heads"]) * desc["splits"]  # (head, split) tasks
        assert desc["num_tasks"] == 40  # the prefill's stride over the (head, row block) tiles
    flags = lw.tasks.task_table()[rows, FLAGS].tolist()
    assert decode < 40 and len(rows) == 40 and flags == [0] * decode + [PREFILL_ONLY] * (40 - decode)
    # the interpreter's grid is one program: no task only prefills
    assert not any(t.prefill_only for t in _lowered("tiny-llama").tasks.tasks)


def test_batched_projections_split_blocks_that_divide_and_are_few():
    from codegen.bodies.linear import LINEAR_FIELDS
    from codegen.lower import linear_splits

    config = CompileConfig(block_n=16, wide_m=64, batch_n=64, target_programs=264)
    assert linear_splits(config, 4096) == 4  # 64 blocks of 64 columns, each K over 4 tasks
    assert linear_splits(config, 200 * 64) == 2  # 2 splits give a task for every program
    assert linear_splits(config, 28672) == 1  # 448 blocks: a wave already
    assert linear_splits(dataclasses.replace(config, batch_splits=2), 28672) == 2
    assert linear_splits(dataclasses.replace(config, batch_splits=8), 4096) == 4  # at most 64 // 16
    assert linear_splits(config, 272) == 1  # 64 does not divide the columns
    # steps of more than rows_max rows take the blocks, however few rows the blocks have
    assert linear_splits(dataclasses.replace(config, wide_m=16), 4096) == 4
    assert linear_splits(dataclasses.replace(config, wide_m=16, rows_max=16), 4096) == 1  # no step takes them
    # the batched blocks' rows follow the batch unless given: a batch of 32 reads its inputs once, not twice
    assert [CompileConfig(max_batch=b).wide_rows for b in (8, 32, 33, 64)] == [32, 32, 64, 64]
    assert CompileConfig(max_batch=64, wide_m=16).wide_rows == 16
    config = dataclasses.replace(CONFIG, block_n=16, wide_m=32, batch_n=32)
    lw = lower(build_graph(resolve_model("tiny-qwen3"), config), config)
    field = {name: i for i, name in enumerate(LINEAR_FIELDS)}
    descs = {lw.tasks.descs[t.desc][field["n"]]: lw.tasks.descs[t.desc] for t in lw.tasks.tasks
             if t.kind == Kind.LINEAR}
    assert descs[64][field["splits"]] == 2 and descs[64][field["part_off"]] == lw.layout.offset("linear_parts")
    assert descs[272][field["splits"]] == 1 and descs[272][field["ticket_off"]] == -1
    # every split projection's tickets lie in the region the planner zeroes each step
    stats = range(lw.constants["STATS_OFF"], lw.constants["STATS_OFF"] + lw.constants["STATS_SIZE"])
    assert all(d[field["ticket_off"]] in stats for d in descs.values() if d[field["splits"]] > 1)


def test_follows_sees_chains_of_same_step_waits_only():
    graph, desc = _graph()
    embed, linear = _chain(graph, desc)
    later = graph.add_group(Kind.ADD, desc, 1, "add", (linear,))
    beside = graph.add_group(Kind.ADD, desc, 1, "beside", (embed,))
    assert graph.follows((later,), embed.event) and graph.follows((later,), linear.event)
    assert not graph.follows((beside,), linear.event)
    assert not graph.follows((Wait(linear.event, linear.count, lag=1),), linear.event)


def test_the_projection_of_attention_prefetches_more_of_its_weights():
    config = dataclasses.replace(CONFIG, prefetch_kb=1, prefetch_attention_kb=128)
    lw = lower(build_graph(resolve_model("tiny-llama"), config), config)
    for task in (t for t in lw.tasks.tasks if t.kind == Kind.LINEAR and t.prefetch.rows):
        k = lw.tasks.descs[task.desc][2]
        reads_attention = lw.tasks.event_names[task.waits[0].event].startswith("attention.")
        assert task.prefetch.row_bytes == (k * 2 if reads_attention else (1 << 10) // task.prefetch.rows // 16 * 16)


# -- streamed one-row steps --------------------------------------------------------------------------------
def test_streamed_parts_take_whole_tiles_where_that_costs_little():
    """`stream_range`, as `gemv_stream` cuts a group: Llama-3-8B's gate/up on 264 programs in 7 or 6 whole tiles
    a part (28 KB past an even share of 6.79), its LM head (83 KB past) and everything with `stream_whole_kb=0`
    evenly, tiles shared; the parts' ranges cover the units in order either way."""
    from codegen.lower import stream_range

    config = CompileConfig(max_batch=1)
    for fields, n, whole in (({}, 28672, True), ({}, 128256, False), ({"stream_whole_kb": 0}, 28672, False)):
        cfg = dataclasses.replace(config, **fields)
        chunks = 4096 // cfg.stream_block_k
        ranges = [stream_range(cfg, n, 4096, 2, part, 264) for part in range(264)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n // cfg.block_n * chunks
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(lo % chunks == 0 for lo, _ in ranges) == whole
    sizes = {(hi - lo) // chunks for lo, hi in (stream_range(config, 28672, 4096, 2, part, 264) for part in range(264))}
    assert sizes == {6, 7}


def test_projections_of_many_tiles_a_program_stream_their_one_row_steps():
    """A projection with stream_waves tiles a program or more is flagged to stream its one-row steps, each task
    past its tiles working only then, each of the first target_programs tasks prefetching where its part of the
    group starts; the rest keep a task a tile. The tickets are among the words the planner zeroes every step."""
    from codegen.lower import streamable

    config = dataclasses.replace(CONFIG, interpret=False, target_programs=3, stream_waves=2, stream_gemv=True)
    lw = lower(build_graph(resolve_model("tiny-llama"), config), config)
    groups: dict[int, list[Task]] = {}
    for task in lw.tasks.tasks:
        if task.kind == Kind.LINEAR:
            groups.setdefault(task.signal, []).append(task)
    streamed = 0
    for tasks in groups.values():
        desc = lw.tasks.descs[tasks[0].desc]
        n, k, w_off = desc[LINEAR_FIELDS.index("n")], desc[LINEAR_FIELDS.index("k")], desc[LINEAR_FIELDS.index("w_off")]
        tiles = -(-n // config.block_n)
        assert streamable(config, n) == (tiles >= 2 * 3)
        assert all(t.streams == streamable(config, n) for t in tasks)
        assert len(tasks) == max(tiles, 3 if tasks[0].streams else 0)
        assert [t.stream_only for t in tasks] == [t.tile >= tiles for t in tasks]
        if tasks[0].streams:
            streamed += 1
            chunks = -(-k // config.stream_block_k)
            for part in range(3):
                tile, chunk = divmod(part * tiles * chunks // 3, chunks)
                assert tasks[part].prefetch.offset == w_off + tile * config.block_n * k + chunk * config.stream_block_k
    assert streamed >= 2  # gate/up and the LM head
    zeroed = range(lw.constants["STATS_OFF"], lw.constants["STATS_OFF"] + lw.constants["STATS_SIZE"])
    assert lw.layout.offset("tickets:stream") in zeroed and lw.layout.offset("stream_out") not in zeroed
    table = lw.tasks.task_table()
    assert {int(f) & (STREAMS | STREAM_ONLY) for f in table[:, FLAGS]} >= {0, STREAMS}

    off = dataclasses.replace(config, stream_gemv=False)
    lw = lower(build_graph(resolve_model("tiny-llama"), off), off)
    assert not any(t.streams for t in lw.tasks.tasks) and "tickets:stream" not in lw.layout.regions


@pytest.mark.parametrize("preset,max_batch,streams", [("tiny-llama", 1, True), ("tiny-llama", 2, True),
                                                      ("tiny-llama", 9, False), ("tiny-qwen3-moe", 1, False)])
def test_streaming_by_default_only_where_a_layer_streams_and_batches_are_small(preset, max_batch, streams):
    """`stream_gemv` -1 (the default) streams a kernel of at most `stream_max_batch` sequences (here 8), whose
    batched steps' blocks the body's registers do not cost, and only where some layer's projection streams: an
    MoE model's experts leave it the LM head alone (with 15 tiles needed, tiny-qwen3-moe's one dense layer has 14;
    tiny-llama's gate/up 25)."""
    config = dataclasses.replace(CONFIG, interpret=False, target_programs=3, stream_waves=5, stream_gemv=-1,
                                 max_batch=max_batch, stream_max_batch=8)
    lw = lower(build_graph(resolve_model(preset), config), config)
    streamed = {lw.tasks.event_names[t.signal] for t in lw.tasks.tasks if t.streams}
    assert bool(streamed) == streams
    assert ("tickets:stream" in lw.layout.regions) == streams
    if streams:
        assert "lm_head" in streamed and len(streamed) > 1
    with pytest.raises(ValueError, match="stream_gemv"):
        dataclasses.replace(config, stream_gemv=2)


@pytest.mark.parametrize("max_batch", [1, 8])
def test_moe_combined_in_down_leaves_the_group_to_prefills(max_batch):
    """`moe_combine_in_down` on Qwen3-30B-A3B: every combine task is prefill-only, down's descriptor points at
    the combine's and at a ticket a column tile (among the words the planner zeroes), counting the slots a
    decode step runs (8 at batch 1, of 11; 64 at batch 8), and the next layer's QKV waits for down as well as
    for the combine."""
    config = CompileConfig(max_batch=max_batch, max_tokens_per_step=512, max_model_len=1024, max_new_tokens=64,
                           target_programs=264, moe_combine_in_down=1)
    lw = _lowered("qwen3-30b-a3b", config)
    check_schedule(lw.tasks, lw.sample)
    names = lw.tasks.event_names
    assert all(t.prefill_only for t in lw.tasks.tasks if t.kind == Kind.COMBINE)
    down = next(t for t in lw.tasks.tasks if names[t.signal].endswith(".down"))
    desc = dict(zip(EXPERT_FIELDS, lw.tasks.descs[down.desc]))
    combine = lw.tasks.descs[down.desc + desc["combine_rel"] // DESC_WORDS]
    assert combine[:len(COMBINE_FIELDS)] == lw.tasks.descs[next(t.desc for t in lw.tasks.tasks
                                                                if t.kind == Kind.COMBINE)][:len(COMBINE_FIELDS)]
    assert desc["decode_slots"] == 8 * max_batch
    zeroed = range(lw.constants["STATS_OFF"], lw.constants["STATS_OFF"] + lw.constants["STATS_SIZE"])
    assert desc["combine_tickets"] in zeroed
    qkv1 = next(t for t in lw.tasks.tasks if names[t.signal] == "qkv.1")
    assert {names[w.event] for w in qkv1.waits} == {names[down.signal], names[down.signal][:-5] + ".combine"}


@pytest.mark.parametrize("max_batch", [1, 8, 64])
def test_moe_routed_in_the_router_up_to_route_loop_rows(max_batch):
    """`moe_route_in_router` (with `moe_combine_in_down`) on Qwen3-30B-A3B: up to route_loop_rows (8) sequences,
    every routing task is prefill-only, the router's descriptor points at the routing's and at a ticket the
    planner zeroes, and gate/up waits for the router as well as the routing; at 64 the routing stays a group of
    its own for decode steps too."""
    config = CompileConfig(max_batch=max_batch, max_tokens_per_step=512, max_model_len=1024, max_new_tokens=64,
                           target_programs=264, moe_route_in_router=1, moe_combine_in_down=1)
    lw = _lowered("qwen3-30b-a3b", config)
    check_schedule(lw.tasks, lw.sample)
    names = lw.tasks.event_names
    routes = [t for t in lw.tasks.tasks if t.kind == Kind.ROUTE]
    router = next(t for t in lw.tasks.tasks if names[t.signal] == "model.layers.0.mlp.gate.weight")
    desc = dict(zip(LINEAR_FIELDS, lw.tasks.descs[router.desc]))
    gate_up = next(t for t in lw.tasks.tasks if names[t.signal].endswith(".gate_up"))
    if max_batch > 8:
        assert (desc["route_rel"], desc["route_ticket"]) == (0, -1) and not all(t.prefill_only for t in routes)
        return
    assert all(t.prefill_only for t in routes)
    assert lw.tasks.descs[router.desc + desc["route_rel"] // DESC_WORDS][:len(ROUTE_FIELDS)] == \
        lw.tasks.descs[routes[0].desc][:len(ROUTE_FIELDS)]
    zeroed = range(lw.constants["STATS_OFF"], lw.constants["STATS_OFF"] + lw.constants["STATS_SIZE"])
    assert desc["route_ticket"] in zeroed
    assert {names[w.event] for w in gate_up.waits} == {"moe_route", names[router.signal],
                                                       "model.layers.0.self_attn.o_proj.weight"}
