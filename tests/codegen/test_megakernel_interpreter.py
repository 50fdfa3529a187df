"""The generated megakernel under TRITON_INTERPRET=1 (grid of one program) ≈ the reference engine.

Compiled through the real path (`compile_model` -> artifact -> `Megakernel.load`), fp32 so that greedy
tokens must match exactly, with prompts of different lengths, chunked prefill and requests finishing at
different steps.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from blinkc.compile_model import WeightsSource, compile_model
from blinkc.engine import EngineConfig, ReferenceEngine
from blinkc.random_checkpoint import write_random_checkpoint
from blinkc.weights import load_weights
from codegen.bodies import common, sync
from codegen.config import CompileConfig
from codegen.layout import ABORT_ASKED, ABORT_ASKED_RECORDED, ABORT_HANG, CONTROL_FIELDS, HANG_SPLIT_TICKET
from codegen.lower import linear_splits
from codegen.tasks import FLAGS, PREFILL_ONLY, STREAMS, Kind
from ir import DType
from ir.executor import execute
from models.presets import TINY_PRESETS, preset_config
from models.trace import trace_model
from runtime.megakernel import HangError, Megakernel
from runtime.sampling import SamplingParams
from runtime.step import whole_prompts_step
from tests.conftest import assert_close, fp32_model

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter tests (CPU)")

CONFIG = CompileConfig(max_batch=3, max_tokens_per_step=16, max_model_len=64, max_new_tokens=12, page_size=4,
                       interpret=True, spin_limit=64, block_n=64, block_k=64)  # wide tiles: fewer interpreted tasks
PROMPTS = [[5, 17, 200, 33, 7, 99, 1, 2, 3, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [44, 55, 66], [100, 3, 9]]


@pytest.fixture(scope="module")
def compiled(checkpoint, tmp_path_factory):
    """preset -> (Megakernel on the CPU, the reference engine's greedy outputs)."""
    made = {}

    def get(preset):
        if preset not in made:
            directory = checkpoint(preset)
            model = fp32_model(directory)
            out = tmp_path_factory.mktemp(f"{preset}-kernel") / "model.cubin"
            compile_model(model, CONFIG, out, WeightsSource(directory), dtype=DType.f32)
            kernel = Megakernel.load(out, device="cpu")
            graph = trace_model(model.definition, model.config, page_size=4)
            engine = ReferenceEngine(graph, load_weights(graph, directory), config=EngineConfig(num_pages=64))
            made[preset] = kernel, engine
        return made[preset]

    return get


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_greedy_tokens_match_the_reference_engine(preset, compiled):
    kernel, engine = compiled(preset)
    lengths = [7, 12, 4]
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    ours = kernel.generate(PROMPTS, params)
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        (expected,) = engine.generate([prompt], p)
        diff = first_difference(ours[i].tokens, expected)
        assert diff is None, f"request {i}: first differing token at index {diff}: {ours[i].tokens} vs {expected}"
        assert ours[i].finish_reason == "length"


def test_partial_rotary_matches_the_reference_engine(tmp_path):
    """Rotary on the first half of each head only (`partial_rotary_factor`): the epilogue gathers each
    column's partner and leaves the other half alone. Decode steps run one row, the first step 19."""
    hf_config = {**preset_config("tiny-llama"), "partial_rotary_factor": 0.5}
    directory = write_random_checkpoint(hf_config, tmp_path / "ckpt", seed=3, std=0.05)
    model = fp32_model(directory)
    assert model.config.rotary_dim < model.config.head_dim
    out = compile_model(model, CONFIG, tmp_path / "partial.cubin", WeightsSource(directory), dtype=DType.f32).path
    kernel = Megakernel.load(out, device="cpu")
    graph = trace_model(model.definition, model.config, page_size=4)
    engine = ReferenceEngine(graph, load_weights(graph, directory), config=EngineConfig(num_pages=64))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    (ours,) = kernel.generate([PROMPTS[0]], params)
    (expected,) = engine.generate([PROMPTS[0]], params)
    assert ours.tokens == expected, f"first differing token at {first_difference(ours.tokens, expected)}"


def test_stops_at_eos_and_reports_it(compiled):
    kernel, engine = compiled("tiny-llama")
    (free,) = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    eos = free[2]
    kernel.manifest["model"]["eos_token_ids"] = [eos]
    try:
        (out,) = kernel.generate([PROMPTS[1]], SamplingParams(max_tokens=6, temperature=0))
    finally:
        kernel.manifest["model"]["eos_token_ids"] = []
    assert out.tokens == free[: free.index(eos) + 1] and out.finish_reason == "stop"


def test_sampling_on_the_kernel_is_seeded_and_top_k_one_is_greedy(compiled):
    kernel, _ = compiled("tiny-qwen3")
    greedy = kernel.generate(PROMPTS[:2], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    top1 = kernel.generate(PROMPTS[:2], SamplingParams(max_tokens=5, temperature=0.8, top_k=1, seed=3, ignore_eos=True))
    assert [c.tokens for c in top1] == [c.tokens for c in greedy]
    hot = SamplingParams(max_tokens=5, temperature=5.0, top_p=0.95, seed=11, ignore_eos=True)
    first, again = kernel.generate(PROMPTS[:1], hot), kernel.generate(PROMPTS[:1], hot)
    other = kernel.generate(PROMPTS[:1], SamplingParams(max_tokens=5, temperature=5.0, top_p=0.95, seed=12,
                                                        ignore_eos=True))
    assert first[0].tokens == again[0].tokens
    assert first[0].tokens != other[0].tokens
    assert first[0].tokens != greedy[0].tokens
    # any int is a seed (wrapped into the kernel's int32 word), and a top_k past the vocabulary cuts nothing
    wrapped = kernel.generate(PROMPTS[:1], dataclasses.replace(hot, seed=11 + (1 << 40), top_k=10**12))
    assert wrapped[0].tokens == first[0].tokens


def test_each_steps_logits_match_the_reference_executor(compiled):
    """Launches bounded to 1, 2, ... steps (`max_steps`), each one's last step's logits, a row a sequence, against
    the reference executor's for the tokens each request had by then (`last_step_rows` says whose and how many):
    prompts of 19 and 30 tokens in 16-token steps end their prefill in different steps, the first decoding beside
    the second's prefill, then the second alone."""
    kernel, engine = compiled("tiny-llama")
    prompts = [PROMPTS[0], [(11 * i + 5) % 250 + 1 for i in range(30)]]
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    steps, finished = [], False
    while not finished:
        out = kernel.generate(prompts, params, max_steps=len(steps) + 1)
        tokens = [p + c.tokens for p, c in zip(prompts, out)]
        steps.append(kernel.last_step_rows())
        assert_close(kernel.last_logits(), reference_logits(engine, [tokens[r][:n] for r, n in steps[-1]]))
        finished = all(c.finish_reason != "incomplete" for c in out)
    assert steps == [[(0, 16)], [(0, 19), (1, 13)], [(0, 20), (1, 28)], [(1, 30)], [(1, 31)]]


def reference_logits(engine: ReferenceEngine, sequences: list[list[int]]) -> torch.Tensor:
    """The last token's logits of each sequence, prefilled whole in one step by the reference executor on empty
    caches of its own."""
    caches = {name: torch.zeros_like(cache) for name, cache in engine.caches.items()}
    step, _ = whole_prompts_step(sequences, engine.page_size)
    return execute(engine.graph, engine.params, {**step, **caches})["logits"]


def test_a_wait_that_is_never_satisfied_is_reported_as_a_hang(compiled):
    kernel, _ = compiled("tiny-phi")
    launch = kernel.schedule  # the launch's task table (a group's tasks share their waits)
    saved = launch.clone()
    group = torch.nonzero(launch[:kernel.tasks.shape[0], 3] == launch[5, 3]).flatten()
    launch[group, 4:7] = torch.tensor([launch[5, 3], 1000, 0])  # a count the group's own event never reaches
    try:
        with pytest.raises(HangError, match=rf"step 0, task {int(group[0])} waited on event \d+ \(.*\): "
                                            r"reached \d+ of 1000"):
            kernel.generate(PROMPTS[:1], SamplingParams(max_tokens=2, temperature=0))
    finally:
        launch.copy_(saved)


@pytest.mark.parametrize("flag, kind, task, message", [
    (ABORT_HANG, ABORT_HANG, HANG_SPLIT_TICKET,
     r"hang: in step 3, a split of block 5 waited for the block's other splits: 2 of 4"),
    (ABORT_ASKED, ABORT_ASKED_RECORDED, 7,
     r"hang: the launch ran past 600 s and was stopped; in step 3, task 7 waited on event 5 "),
    (ABORT_ASKED, 0, 0, r"hang: the launch ran past 600 s and was stopped in step 1, no task waiting"),
    (ABORT_ASKED, ABORT_HANG, 7, r"hang: in step 3, task 7 waited on event 5 ")])
def test_the_kernels_error_words_are_reported_as_hangs(compiled, flag, kind, task, message):
    """What the runtime makes of the error words a launch leaves (written here by hand; the GPU gives the host
    timeout's, tests/gpu): a split-K block's split that waited for the others past the spin limit (`split_slices`,
    GPU only: it waits where the launch has a program for every split); a launch the host asked to stop after its
    timeout, where a wait saw the flag and recorded where it was waiting, or none did; and a hang the device
    recorded before the host's timeout wrote its flag over the hang's, which the record outlives."""
    kernel, _ = compiled("tiny-llama")
    assert common.SPLIT_TICKET.value == HANG_SPLIT_TICKET
    assert (sync.STEP_WORD.value, sync.ERROR_FLAG.value, sync.ERROR_KIND.value) == (
        CONTROL_FIELDS.index("step"), CONTROL_FIELDS.index("error_flag"), CONTROL_FIELDS.index("error_kind"))
    after = sync.ERROR_FLAG.value + 1  # `record_hang` writes the five words after the flag
    assert CONTROL_FIELDS[after:after + 5] == ("error_step", "error_task", "error_event", "error_value", "error_target")
    assert (sync.HANG.value, sync.ASKED.value, sync.ASKED_RECORDED.value) == (ABORT_HANG, ABORT_ASKED,
                                                                             ABORT_ASKED_RECORDED)
    control = kernel.region("control")[0]
    words = kernel.i32.clone()
    words[control + 3] = 1  # the step planned last
    if kind:
        words[control + 7:control + 12] = torch.tensor([3, task, 5, 2, 4])
    words[control + CONTROL_FIELDS.index("error_flag")] = flag
    words[control + CONTROL_FIELDS.index("error_kind")] = kind
    with pytest.raises(HangError, match=message):
        kernel._raise_on_hang(words)
    if not kind:  # a loop queued behind the kernel planned its first step, 2, after it: the step word is the loop's
        assert kernel.hang_report(words, planned_from=2) == ("hang: the launch ran past 600 s and was stopped before "
                                                             "step 2, no task waiting")


def test_bad_requests_are_clear_errors(compiled):
    kernel, _ = compiled("tiny-llama")
    with pytest.raises(ValueError, match="between 1 and 3 prompts"):
        kernel.generate(PROMPTS * 2, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="exceeds the compiled max_model_len"):
        kernel.generate([PROMPTS[0]], SamplingParams(max_tokens=60))
    with pytest.raises(ValueError, match="token ids in"):
        kernel.generate([[10**6]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="token ids in"):
        kernel.generate([[5, -1]], SamplingParams(max_tokens=2))


@pytest.mark.parametrize("qkv_block_m, wide_m, block_n, tma, prefill_splits, merge_group, fields", [
    (16, 16, 64, "", 0, True, {}), (32, 32, 16, "", 0, False, {"prefill_claimed_part": 1}),
    (16, 16, 64, "prefill", 0, True, {"prefill_m": 128}), (64, 32, 16, "batch", 0, True, {}),
    (16, 16, 16, "", 3, True, {}), (16, 16, 16, "prefill", 2, True, {"prefill_claimed_part": 1})])
def test_split_tasks_match_the_reference_engine(checkpoint, tmp_path, qkv_block_m, wide_m, block_n, tma,
                                                prefill_splits, merge_group, fields):
    """Decode steps split each QKV head's K range, each sequence's context and its greedy argmax over
    tasks; the last to finish merges the parts in order. The first step (31 prompt tokens; two prompts
    have attention blocks of prefill rows, which all of the group's tasks share) either takes
    two row blocks of 16 (projections on wide [16, 32] tiles shared by a group's tasks, QKV on (head, row
    block) tiles likewise), or fits one block of 32 rows: QKV heads split K (32-row dots, also where qkv_block_m
    is 64 and wide_m, the batched decode's rows, 32), and so do projections whose columns divide into blocks
    of 32 (each block's K over two tasks of 16 columns); the others' tasks own whole blocks (gate/up: 272
    columns; the LM head). Where wide_m is 32 the decode steps (three sequences) take blocks of 16 rows
    (`narrow_batch_rows`). Tasks are taken from the ticket counter (dynamic_tasks), carried over from step to
    step. With `tma`, the wide tiles ("prefill") or the blocks of 32 columns ("batch") load through tensor
    descriptors (rows and columns past the ends read as zeros). With
    `prefill_splits`, the first step's wide tiles also split K (chunks of 16: with 3 splits, [0, 32),
    [32, 64) and an empty one), the last split of each running the epilogue. With `merge_group` (the default), the
    attention splits only store their partials and a group of their own (a task a sequence and query head)
    merges them; without, the last split of a sequence and KV head to finish merges its group's. A group's first
    task (the interpreter's one program) takes its wide tiles but one in `prefill_claimed_part` (8, rounded down)
    of them, its later tasks the rest; at 1, the first takes one tile only. `prefill_m` 128 (wide tiles of 128
    rows instead of wide_m) runs their epilogue a half at a time."""
    directory = checkpoint("tiny-qwen3")
    model = fp32_model(directory)
    # K = 64: QKV parts [0, 32), [32, 64), empty; contexts up to 11 tokens: attention parts of 16 keys
    config = dataclasses.replace(CONFIG, qkv_splits=3, block_k=16, attention_splits=3, block_kv=16,
                                 prefill_splits=prefill_splits, block_k_dot=16 if prefill_splits else 64,
                                 sample_splits=3,  # greedy argmax over three vocabulary chunks
                                 max_tokens_per_step=32, wide_m=wide_m, wide_n=32, batch_n=32,
                                 dynamic_tasks=True, qkv_block_m=qkv_block_m, block_n=block_n,
                                 prefill_tma=tma == "prefill", batch_tma=tma == "batch",
                                 attention_merge_group=merge_group, **{"prefill_m": wide_m} | fields)
    out = compile_model(model, config, tmp_path / "split.cubin", WeightsSource(directory), dtype=DType.f32).path
    kernel = Megakernel.load(out, device="cpu")
    graph = trace_model(model.definition, model.config, page_size=4)
    engine = ReferenceEngine(graph, load_weights(graph, directory), config=EngineConfig(num_pages=64))
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [PROMPTS[0], [44, 55, 66, 77, 88, 99, 10, 20, 30], PROMPTS[2]]
    ours = kernel.generate(prompts, params)  # the 19-token prompt's context reaches 30: two attention parts
    for prompt, completion in zip(prompts, ours):
        (expected,) = engine.generate([prompt], params)
        assert completion.tokens == expected, (
            f"first differing token at {first_difference(completion.tokens, expected)}")


def _tiny_kernel(checkpoint, path, config, preset="tiny-llama"):
    """(the preset's fp32 kernel built with `config`, a check that its greedy tokens match the reference engine's
    for the prompts (PROMPTS unless given) at the given max tokens each)."""
    directory = checkpoint(preset)
    model = fp32_model(directory)
    kernel = Megakernel.load(compile_model(model, config, path, WeightsSource(directory), dtype=DType.f32).path,
                             device="cpu")
    graph = trace_model(model.definition, model.config, page_size=4)
    engine = ReferenceEngine(graph, load_weights(graph, directory), config=EngineConfig(num_pages=64))

    def check(max_tokens, prompts=PROMPTS):
        params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in max_tokens]
        for prompt, p, completion in zip(prompts, params, kernel.generate(prompts, params)):
            (expected,) = engine.generate([prompt], p)
            assert completion.tokens == expected, \
                f"first differing token at {first_difference(completion.tokens, expected)}"
    return kernel, check


def test_waits_polling_with_loads_match_the_reference_engine(checkpoint, tmp_path):
    """`poll_loads`: every wait reads its event with volatile loads and acquires once the count is there (here by an
    atomic: the interpreter runs no inline PTX, where a GPU build takes a fence)."""
    config = dataclasses.replace(CONFIG, poll_loads=True)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "poll_loads.cubin", config)
    assert "POLL_LOADS = tl.constexpr(1)" in kernel.artifact.source_path.read_text()
    check((6, 6, 6))


def test_decode_attention_in_key_blocks_of_its_own_matches_the_reference_engine(checkpoint, tmp_path):
    """Decoding sequences' attention reads its keys in blocks of 16 while the prompts' prefill reads them in
    blocks of 32 (`decode_block_kv`, larger than block_kv on the GPU where a task's keys are many), each
    sequence's context over two tasks; and both read their page ids a block at a time (windows of one block:
    the key loop restarts at every block)."""
    config = dataclasses.replace(CONFIG, block_kv=32, decode_block_kv=16, attention_splits=2, decode_window_keys=16,
                                 prefill_window_keys=32)
    _, check = _tiny_kernel(checkpoint, tmp_path / "decode_blocks.cubin", config)
    check((12, 12, 12))


@pytest.mark.parametrize("fields", [{}, {"epilogue_tma": True}, {"gated_tma": False},
                                    {"gated_tma": False, "epilogue_tma": True}, {"qkv_prefill_m": 64},
                                    {"short_prefill_tokens": 128}],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "default")
def test_prefill_tiles_of_128_rows_match_the_reference_engine(checkpoint, tmp_path, fields):
    """A 100-token prompt beside a 3-token one, prefilled in one step on [128, 32] tiles (`prefill_m` 128, the
    default where a step prefills 512 tokens or more): both halves of a tile's epilogue hold rows. With
    `epilogue_tma`, the halves' residuals and stores go through tensor descriptors, rows past the step's last
    neither read nor written. By default (`gated_tma`) gate/up's tiles are gated and stored over all 128 rows at
    once, through a tensor descriptor. QKV's tiles take 128 rows too (`qkv_prefill_rows`), their epilogue a half at
    a time, or with `qkv_prefill_m` 64 their own 64. With `short_prefill_tokens` 128 the step (103 tokens) takes
    the kernel's 64-row tiles instead, QKV's included (0, the other cases: a step never does)."""
    config = dataclasses.replace(CONFIG, max_tokens_per_step=128, max_model_len=128, prefill_m=128, wide_n=32,
                                 **{"short_prefill_tokens": 0} | fields)
    _, check = _tiny_kernel(checkpoint, tmp_path / "rows128.cubin", config)
    check((4, 4), [[(7 * i + 3) % 250 + 1 for i in range(100)], PROMPTS[1]])


def test_prefill_attention_from_the_steps_rows_matches_the_reference_engine(checkpoint, tmp_path):
    """`attention_step_keys`: a prefill block reads its own step's keys and values from the rows the QKV epilogue
    also wrote them to, through tensor descriptors, and earlier steps' from the pages: the 19-token prompt
    prefills over two 16-token steps, the second attending to both."""
    config = dataclasses.replace(CONFIG, attention_step_keys=True)
    _, check = _tiny_kernel(checkpoint, tmp_path / "step_keys.cubin", config)
    check((7, 12, 4))


@pytest.mark.parametrize("rows_gemv, rows_max", [(4, 4), (0, 16)])
def test_few_row_steps_match_the_reference_engine(checkpoint, tmp_path, rows_gemv, rows_max):
    """Steps of two and three decoding sequences take `gemv_rows` (each weight chunk times every row in turn,
    the rows past the step's masked) or, with no few-row GEMV, the 16-row tensor-core dots, instead of the
    batched blocks (the default past two rows), and still match token for token. The worker loop keeps its
    state in registers here (park_state off), as a kernel built without parking does."""
    config = dataclasses.replace(CONFIG, rows_gemv=rows_gemv, rows_max=rows_max, park_state=False)
    _, check = _tiny_kernel(checkpoint, tmp_path / "rows.cubin", config)
    check((7, 12, 4))


def test_batched_blocks_with_fewer_splits_than_tasks_match_the_reference_engine(checkpoint, tmp_path):
    """Blocks of 64 columns over tasks of 16 with their K split in 2 (`batch_splits`): tiny-qwen3's o_proj and
    down have one block, whose first two tasks split it while the other two have none, and steps of three rows
    still match token for token."""
    config = dataclasses.replace(CONFIG, block_n=16, wide_m=32, batch_n=64, batch_splits=2)
    assert linear_splits(config, 64) == 2
    _, check = _tiny_kernel(checkpoint, tmp_path / "splits.cubin", config, "tiny-qwen3")
    check((7, 12, 4))


def test_sampling_without_a_cut_draws_the_same_tokens_however_the_row_is_split(checkpoint, tmp_path):
    """A seeded draw at a temperature depends on the seed, not on how many sampling tasks a sequence's row of
    logits is cut into: each task draws over its chunk, and each token's Gumbel noise is drawn by its index."""
    tokens = []
    for splits in (1, 4):
        kernel, _ = _tiny_kernel(checkpoint, tmp_path / f"sample{splits}.cubin",
                                 dataclasses.replace(CONFIG, sample_splits=splits), "tiny-qwen3")
        params = SamplingParams(max_tokens=6, temperature=1.5, seed=5, ignore_eos=True)
        tokens.append([c.tokens for c in kernel.generate(PROMPTS[:2], params)])
    greedy = [c.tokens for c in kernel.generate(PROMPTS[:2], SamplingParams(max_tokens=6, temperature=0,
                                                                            ignore_eos=True))]
    assert tokens[0] == tokens[1]
    assert tokens[0] != greedy


def test_an_moe_norm_as_a_group_of_its_own_matches_the_reference_engine(checkpoint, tmp_path):
    """Without `moe_fold_norm` (on by default, as in the greedy test above), an MoE layer's RMSNorm is a group of
    its own whose output gate/up reads, while the router still folds it in, and the tokens still match."""
    config = dataclasses.replace(CONFIG, moe_fold_norm=False)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "moe_norm_group.cubin", config, "tiny-qwen3-moe")
    assert (kernel.tasks[:, 0] == Kind.RMS_NORM).any()  # word 0: the task's kind
    check((7, 12, 4))


@pytest.mark.parametrize("claims", [True, False])
def test_experts_in_wider_prefill_blocks_match_the_reference_engine(claims, checkpoint, tmp_path):
    """With `expert_prefill_m`, an expert with more than block_m rows in a step takes them in blocks of that
    many, claimed (`expert_claims`) or a slot's share. The 53 prompt tokens prefill in one step: 106 (token,
    expert) pairs over 6 experts give some expert at least 18 rows."""
    config = dataclasses.replace(CONFIG, max_tokens_per_step=64, expert_prefill_m=32, expert_claims=claims)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / f"expert_prefill{claims}.cubin", config, "tiny-qwen3-moe")
    check((4, 3), prompts=[[(7 * i + 3) % 1000 for i in range(50)], PROMPTS[2]])


def test_experts_in_wider_prefill_columns_match_the_reference_engine(checkpoint, tmp_path):
    """With `expert_prefill_n`, a prefill step whose experts average more than block_m rows takes blocks two
    of the decode tiles wide, claimed one at a time by the tasks of their columns (`claimed_blocks`): down's 4
    tiles make 2 column blocks, gate/up's 5 make 3, the last one tile wide, with half its columns masked."""
    config = dataclasses.replace(CONFIG, max_tokens_per_step=64, expert_prefill_m=32, expert_block_n=16,
                                 expert_prefill_n=32)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "expert_columns.cubin", config, "tiny-qwen3-moe")
    check((4, 3), prompts=[[(7 * i + 3) % 1000 for i in range(50)], PROMPTS[2]])


def test_an_experts_last_rows_take_shorter_claimed_blocks(checkpoint, tmp_path):
    """With `expert_tail_m` below the claimed blocks' rows, an expert's last block takes dots of that many rows
    where its rows fit, and the tokens still match. The 53 tokens' 106 pairs over 6 experts make blocks of 5 to 13
    rows (short: experts of so few rows, and the last 5 or 7 of those with 32 more) and of 18 to 32 (full)."""
    config = dataclasses.replace(CONFIG, max_tokens_per_step=64, expert_prefill_m=32, expert_tail_m=16)
    assert config.expert_tail_rows == 16
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "expert_tail.cubin", config, "tiny-qwen3-moe")
    check((4, 3), prompts=[[(7 * i + 3) % 1000 for i in range(50)], PROMPTS[2]])


@pytest.mark.parametrize("exact", [True, False])
def test_norm_sums_in_either_width_match_the_reference_engine(exact, checkpoint, tmp_path):
    """The norms' sums of squares in fp64 (`exact_norm_sums`, the default), two words a row, or fp32, one, and the
    tokens match either way. Their producers: the embedding, the gathered final rows, o_proj's residual epilogue
    and the MoE combine; their readers: the norms folded into the projections, QKV, the experts and lm_head, and
    without `moe_fold_norm` (this test) the MoE norm's own group."""
    config = dataclasses.replace(CONFIG, exact_norm_sums=exact, moe_fold_norm=False)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / f"exact_sums{exact}.cubin", config, "tiny-qwen3-moe")
    assert f"NORM_SUMS_F64 = tl.constexpr({exact})" in kernel.artifact.source_path.read_text()
    sizes = {size for name, (_, _, size) in kernel.layout["regions"].items() if name.startswith("stats:")}
    words = 2 if exact else 1
    assert sizes == {words * config.max_tokens_per_step, words * config.max_batch}  # the final norm's: a row a sequence
    check((7, 12, 4))


def test_narrow_projections_prefill_on_tasks_of_their_own(checkpoint, tmp_path):
    """A projection with fewer column tiles than half the programs (o_proj and down: 4 of 16 columns; the router:
    1) gets tasks past them, up to a program each for its prefill tiles, which only prefill steps run: a
    50-token prompt's [16, 16] tiles spread over 8 tasks, and the decode steps' on the column tiles' 4 as before;
    so do the steps that prefill too few rows for tiles (two 3-token prompts, then 20 rows of two prompts: the
    few-row and the batched paths), where the tasks past the column tiles have nothing to do."""
    # (not streamed: on the interpreter's one program o_proj's and down's 4 tiles would stream their one-row steps,
    # and a streamed group takes no prefill-only tasks; on a GPU's grid a streamed projection has stream_waves
    # tiles a program, a narrow one under half a tile, so none is both)
    config = dataclasses.replace(CONFIG, max_tokens_per_step=64, target_programs=8, block_n=16, prefill_m=16,
                                 wide_n=16, stream_gemv=0)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "narrow.cubin", config, "tiny-qwen3-moe")
    linear = kernel.tasks[kernel.tasks[:, 0] == Kind.LINEAR]
    assert ((linear[:, FLAGS] & PREFILL_ONLY) != 0).sum() >= 3 * 3  # at least the router's in each layer
    check((4, 3), prompts=[[(7 * i + 3) % 1000 for i in range(50)], PROMPTS[2]])
    check((3, 3), prompts=PROMPTS[1:])
    check((3, 3), prompts=PROMPTS[:2])
    # launched group by group (baseline (c)), the tasks past the column tiles run in decode steps too: idle
    from runtime.host_driven import HostDriven

    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    prompts = [[(5 * i + 1) % 1000 for i in range(40)], PROMPTS[1]]
    assert ([c.tokens for c in HostDriven(kernel).generate(prompts, params)]
            == [c.tokens for c in kernel.generate(prompts, params)])


def test_expert_slots_past_a_decode_steps_take_experts_only_in_prefill_steps(checkpoint, tmp_path):
    """A kernel for one sequence has two expert slots a layer (top-2), but for 8 programs gate/up gets 4 (two
    column tiles each) and down 6: the slots past the first two have the PREFILL_ONLY flag, take experts in the
    prompt's steps and sit out the decode steps, whose two experts the first two slots take."""
    config = dataclasses.replace(CONFIG, max_batch=1, max_tokens_per_step=32, target_programs=8)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "slots.cubin", config, "tiny-qwen3-moe")
    experts = kernel.tasks[kernel.tasks[:, 0] == Kind.EXPERT]
    assert len(experts) == 2 * (4 * 2 + 6) and ((experts[:, FLAGS] & PREFILL_ONLY) != 0).sum() == 2 * (2 * 2 + 4)
    check((6,), prompts=[PROMPTS[0] + [(7 * i + 3) % 1000 for i in range(30)]])


def test_streamed_gemv_matches_the_reference_engine(checkpoint, tmp_path):
    """With `stream_gemv`, the one-row steps of gate/up and the LM head run as one part a program (here the
    grid's one), each part standing for the group's tasks in its claims and signals, and still match token for
    token (the parts' shared tiles: tests/codegen/test_linear_bodies.py), launched from the host too."""
    from runtime.host_driven import HostDriven

    config = dataclasses.replace(CONFIG, stream_gemv=True)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "stream.cubin", config)
    assert (kernel.tasks[:, FLAGS] & STREAMS).any()  # gate/up and the LM head; one row left after 3 and 6 tokens
    check((9, 3, 6))
    # baseline (c) launches those groups' one-row steps as a CTA a part, and gives the same tokens
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (9, 3, 6)]
    driver = HostDriven(kernel)
    assert len(driver.streamed) == 4  # the three layers' gate/up and the LM head
    host_driven = driver.generate(PROMPTS, params)
    assert [c.tokens for c in host_driven] == [c.tokens for c in kernel.generate(PROMPTS, params)]


def test_host_driven_task_kernels_match_the_persistent_kernel(compiled):
    """The same bodies launched group by group from the host give the same tokens (MoE included)."""
    from runtime.host_driven import HostDriven

    kernel, _ = compiled("tiny-qwen3-moe")
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    persistent = kernel.generate(PROMPTS, params)
    host_driven = HostDriven(kernel).generate(PROMPTS, params)
    assert [c.tokens for c in host_driven] == [c.tokens for c in persistent]


def test_baseline_c_is_timed_on_a_step_that_decodes_every_sequence(compiled):
    """The decode benchmark's baseline (c) replays a step only after the prefill chunks are done (sequences
    that finish their prefill early decode beside the others' chunks: those steps are larger)."""
    from benchmarks.decode import steps_until_all_decode
    from runtime.host_driven import HostDriven

    kernel, _ = compiled("tiny-llama")
    num_steps = kernel.prepare(PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    next_step = steps_until_all_decode(HostDriven(kernel), len(PROMPTS), num_steps)
    assert kernel.last_step_size() == (3, 3)
    assert next_step == 3  # steps 0 and 1 carry the 25 prompt tokens (at most 16 a step), step 2 decodes all


@pytest.mark.parametrize("max_tokens", [(6, 6, 6), (1, 4, 9), (2, 1, 1)])
def test_the_batched_loop_takes_over_where_the_planner_starts_to_only_decode(max_tokens, compiled):
    """`runtime.gluon.steps_before_decoding` (the host's count of the steps a batch runs on the compiled kernel before
    the batched loop takes its decode steps, and the steps after it) is the kernel planner's: its first step of one
    token a sequence, or its end, and the steps from there to its end, for requests that end at different lengths
    (the kernel planned a step at a time, group kernels between)."""
    from runtime.gluon import steps_before_decoding
    from runtime.host_driven import HostDriven

    kernel, _ = compiled("tiny-llama")
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in max_tokens]
    bound, driver, sizes = kernel.prepare(PROMPTS, params), HostDriven(kernel), []
    for step in range(bound):
        driver.step(step)
        if driver.is_done():
            break
        sizes.append(kernel.last_step_size())
    first = next((s for s, (tokens, seqs) in enumerate(sizes) if tokens == seqs), len(sizes))
    assert all(tokens == seqs for tokens, seqs in sizes[first:])
    assert steps_before_decoding([len(p) for p in PROMPTS], list(max_tokens), kernel.config.max_tokens_per_step) \
        == (first, len(sizes) - first)


def _decode_and_host_driven_match(kernel, check, max_batch):
    """`check`'s tokens for the first max_batch prompts (9, 3 and 6 tokens), and the host-driven baseline's the
    same as the persistent kernel's: it runs a decode step's idle prefill-only tasks too, which must do nothing."""
    from runtime.host_driven import HostDriven

    lengths, prompts = (9, 3, 6)[:max_batch], PROMPTS[:max_batch]
    check(lengths, prompts=prompts)
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lengths]
    host_driven = HostDriven(kernel).generate(prompts, params)
    assert [c.tokens for c in host_driven] == [c.tokens for c in kernel.generate(prompts, params)]


def test_moe_combined_in_down_matches_the_reference_engine(checkpoint, tmp_path):
    """With `moe_combine_in_down`, a step that only decodes combines each MoE layer in down's tasks (the last of
    a column tile's slot tasks to finish, by a ticket), its combine group idle and the next layer waiting for
    down too; steps that prefill combine in the group as before. At batch 1 down has prefill-only slots that do
    not arrive (at 3, where every slot's task does: the next test)."""
    config = dataclasses.replace(CONFIG, max_batch=1, moe_combine_in_down=1, moe_route_in_router=0)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / "combine_in_down.cubin", config, "tiny-qwen3-moe")
    combines = kernel.tasks[kernel.tasks[:, 0] == int(Kind.COMBINE)]
    assert (combines[:, FLAGS] & PREFILL_ONLY != 0).all()
    _decode_and_host_driven_match(kernel, check, 1)


@pytest.mark.parametrize("max_batch, in_down", [(1, 0), (3, 1)])
def test_moe_routed_in_the_router_matches_the_reference_engine(max_batch, in_down, checkpoint, tmp_path):
    """With `moe_route_in_router`, a step that only decodes is routed by the router's tasks (the last of its
    column tiles' tasks to finish routes the step's tokens in turn), its routing group idle and the experts
    waiting for the router too; steps that prefill route in the group as before. With `moe_combine_in_down` too,
    a decode step's MoE layer is three groups (router, gate/up, down) instead of five."""
    config = dataclasses.replace(CONFIG, max_batch=max_batch, moe_route_in_router=1, moe_combine_in_down=in_down)
    kernel, check = _tiny_kernel(checkpoint, tmp_path / f"route_in_router{max_batch}.cubin", config,
                                 "tiny-qwen3-moe")
    routes = kernel.tasks[kernel.tasks[:, 0] == int(Kind.ROUTE)]
    assert (routes[:, FLAGS] & PREFILL_ONLY != 0).all()
    _decode_and_host_driven_match(kernel, check, max_batch)
