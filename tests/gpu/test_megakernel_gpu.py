"""The megakernel on the GPU ≈ the reference executor on the GPU (same weights, bf16), full-size models.

The prefill step's logits and the logits of a later decode step (teacher-forced on the kernel's own
tokens) must match the reference within bf16 tolerance.

Their kernels take minutes of ptxas each. On the CPU machine, `BLINK_GPU_PRECOMPILE=1
BLINK_CACHE_DIR=.blink-cache python -m pytest -m gpu tests/gpu -k ...` compiles the selected tests' kernels into the
cache, each test skipping where its kernel would load; a GPU call that carries `.blink-cache/cubins` (with
`BLINK_CACHE_DIR=.blink-cache`) then runs them without compiling.
"""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from blinkc.build import build_graph
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.config import CompileConfig
from codegen.tasks import Kind
from ir.executor import execute
from models.registry import resolve_model
from runtime.megakernel import STOP_GRACE_S, HangError, Megakernel
from runtime.sampling import SamplingParams
from runtime.step import whole_prompts_step
from ir import DType
from tests.conftest import PRECOMPILE, relative_error

# batch 2 and 8: the batched blocks of 32 rows (`rows_max` 1; at 2, batch 2 took the two-row GEMV); 64: 64 rows
# phi-4 and qwen3-32b at 8: a batch on the Gluon kernels (`runtime.gluon.Batch`) takes their projections stream-K
# (too many tiles for whole-K ones), Qwen3's QKV with its q/k norms
CASES = [("llama3-8b", 1), ("llama3-8b", 2), ("llama3-8b", 8), ("llama3-8b", 64), ("qwen3-30b-a3b", 1),
         ("qwen3-30b-a3b", 8), ("qwen3-30b-a3b", 64), ("phi-4", 1), ("qwen3-32b", 1), ("phi-4", 8),
         ("qwen3-32b", 8)]


class KernelWeights(dict):
    """The kernel's weights in checkpoint form, one at a time (the executor looks params up when a node
    reads them), optionally as fp32 copies."""

    def __init__(self, kernel: Megakernel, dtype: DType):
        super().__init__()
        self.kernel, self.dtype = kernel, dtype

    def get(self, name, default=None):
        weight = self.kernel.checkpoint_weight(name)
        return weight.float() if self.dtype == DType.f32 else weight


def reference_logits(model, kernel: Megakernel, sequences: list[list[int]], dtype: DType) -> torch.Tensor:
    """Last-token logits of each sequence, prefilled in one step by the reference executor on the GPU
    (running the same optimised graph the kernel was lowered from; passes are checked on the CPU)."""
    graph = build_graph(model, CompileConfig(), dtype)
    page_size = kernel.config.page_size
    inputs, num_pages = whole_prompts_step(sequences, page_size, "cuda")
    cfg = model.config
    for i in range(cfg.num_hidden_layers):
        inputs[f"kv_cache.{i}"] = torch.zeros(2, num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim,
                                              dtype=dtype.torch, device="cuda")
    with torch.inference_mode():
        return execute(graph, KernelWeights(kernel, dtype), inputs)["logits"]


def assert_within_bf16_tolerance(kernel: Megakernel, model, tokens: list[list[int]]) -> None:
    """The logits of the kernel's last step with sequences, in bf16, are about as close to an fp32 reference as the
    bf16 reference is: bf16 rounding over dozens of random layers drifts by a few percent, so the bar is relative
    to it. tokens: each request's prompt and the tokens generated (a row's logits follow the first tokens of its
    request, as many as `last_step_rows` says)."""
    rows = kernel.last_step_rows()
    assert rows, "the launch ran no step with sequences"
    sequences = [tokens[request][:length] for request, length in rows]
    ours = kernel.last_logits().clone()
    exact = reference_logits(model, kernel, sequences, DType.f32)
    bf16 = reference_logits(model, kernel, sequences, DType.bf16)
    ours_err, bf16_err = relative_error(ours, exact), relative_error(bf16, exact)
    whose = f"rows (request, tokens) {rows}" if len(rows) <= 4 else f"{len(rows)} rows"
    print(f"\n{whose}: relative error vs fp32 reference: megakernel {ours_err:.4f}, bf16 reference {bf16_err:.4f}")
    assert torch.isfinite(ours).all()
    assert ours_err <= 1.5 * bf16_err + 2e-3, f"megakernel {ours_err:.4f} vs bf16 reference {bf16_err:.4f}"


def case_config(batch: int) -> CompileConfig:
    return CompileConfig(max_batch=batch, max_tokens_per_step=max(256, 40 * batch), max_model_len=512,
                         max_new_tokens=8)


@pytest.fixture(autouse=True)
def stop_at_load(monkeypatch):
    """BLINK_GPU_PRECOMPILE (tests/conftest.py): the test stops where its compiled kernel would load."""
    if PRECOMPILE:
        def compiled(path, *args, **kwargs):
            pytest.skip(f"compiled for the GPU: {path}")
        monkeypatch.setattr(Megakernel, "load", staticmethod(compiled))


@pytest.fixture(scope="module", autouse=True)
def precompiled(request):
    """The kernels of every selected case, compiled side by side before the first runs (runs only when some
    case does: skipped tests set up no fixtures)."""
    params = [item.callspec.params for item in request.session.items
              if item.module is request.module and item.originalname == "test_megakernel_matches_reference_on_gpu"]
    seconds = compile_many([(p["preset"], case_config(p["batch"])) for p in params])
    print(f"\ncompiled {len(params)} kernels side by side in {seconds:.0f} s")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("preset,batch", CASES)
def test_megakernel_matches_reference_on_gpu(preset, batch, tmp_path):
    check_against_reference(preset, batch, case_config(batch), tmp_path)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("batch", [1, 64])
def test_the_compiled_kernel_alone_on_gpu(batch, tmp_path):
    """The Gluon kernels off (`gluon=False`: on a Hopper GPU one request and a batch of up to 64 run on them by
    default, so `test_megakernel_matches_reference_on_gpu[llama3-8b-*]` checks those): the compiled kernel's own
    decode steps, of one row and of 64 (what another GPU runs, and a batch of more)."""
    check_against_reference("llama3-8b", batch, case_config(batch), tmp_path, gluon=False)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("gluon", [True, False], ids=["gluon", "compiled"])
def test_one_request_stops_at_an_eos_on_gpu(gluon, tmp_path):
    """One request whose fourth greedy token is made an EOS id stops there ("stop", the EOS kept as the kernel's
    tokens keep it), on the Gluon kernels (the loop's `emit`, then its plan finds the request done) and on the
    compiled kernel alone."""
    if gluon and not PRECOMPILE and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are written for sm_90")
    model = resolve_model("llama3-8b")
    path = compile_model(model, case_config(1), tmp_path / "model.cubin", WeightsSource(seed=1)).path
    kernel = Megakernel.load(path, device="cuda", timeout_s=300, gluon=gluon)
    prompt = torch.randint(0, model.config.vocab_size, (50,), generator=torch.Generator().manual_seed(4)).tolist()
    full = kernel.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].tokens
    kernel.manifest["model"]["eos_token_ids"] = [full[3]]
    out = kernel.generate([prompt], SamplingParams(max_tokens=8, temperature=0))[0]
    assert out.finish_reason == "stop" and out.tokens == full[:full.index(full[3]) + 1]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_lone_request_streams_in_a_kernel_for_8_on_gpu(tmp_path):
    """One request in the batch-8 case's kernel: its decode steps have one row, whose projections stream over
    every program (`stream_gemv` -1 streams kernels of up to `stream_max_batch` sequences)."""
    assert case_config(8).streams_gemv
    check_against_reference("llama3-8b", 1, case_config(8), tmp_path, lengths=[21])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_loads_off_by_default_on_gpu(tmp_path):
    """The tile loads the defaults do not take: the first step prefills 64 prompts on wide tiles of masked
    pointers (`prefill_tma` off), the decode steps' batched blocks load through tensor descriptors made in
    the kernel (`batch_tma`)."""
    config = dataclasses.replace(case_config(64), prefill_tma=False, batch_tma=True)
    check_against_reference("llama3-8b", 64, config, tmp_path)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("rows, tail", [(64, 64), (128, 0), (128, 64)])
def test_experts_in_wider_prefill_blocks_on_gpu(rows, tail, tmp_path):
    """`expert_prefill_m`: an expert with more than block_m rows in the first step (a 512-token prompt: ~32 rows an
    expert) takes them in blocks of 64 or 128 rows, and the combine takes [64, 64] blocks over every task; with
    128-row blocks and `expert_tail_m` 64 (the default), those ~32 rows take the 64-row tail blocks instead."""
    config = dataclasses.replace(case_config(1), max_tokens_per_step=512, max_model_len=600, expert_prefill_m=rows,
                                 expert_tail_m=tail)
    check_against_reference("qwen3-30b-a3b", 1, config, tmp_path, lengths=[512])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("batch", [1, 8])
def test_moe_decode_in_three_groups_a_layer_on_gpu(batch, tmp_path):
    """`moe_route_in_router` and `moe_combine_in_down`: a decode step's MoE layer routed by the router's last
    task and combined by down's last task of each column tile (router, gate/up, down: three groups, not five);
    the prefill still routes and combines in their groups. On by default only where max_batch is 1; forced on
    here at 8 too (H200: passed at 1 and 8, session 43)."""
    config = dataclasses.replace(case_config(batch), moe_route_in_router=1, moe_combine_in_down=1)
    check_against_reference("qwen3-30b-a3b", batch, config, tmp_path)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_launches_repeat_bit_for_bit_on_gpu(tmp_path):
    """One kernel given the same two prompts (512 and 37 tokens) again and again gives the same logits bit for
    bit, after the prefill and after 4 decode steps: the norms' sums of squares, atomics in no fixed order, are
    fp64 (`exact_norm_sums`). In fp32 they made every launch's logits differ (H200, Qwen3-30B-A3B, a 2,048-token
    prompt: benchmarks/RESULTS.md, session 42)."""
    config = dataclasses.replace(case_config(2), max_tokens_per_step=576, max_model_len=640)  # both in one step
    model = resolve_model("llama3-8b")
    kernel = Megakernel.load(compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path,
                             device="cuda", timeout_s=300)
    g = torch.Generator().manual_seed(42)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (512, 37)]
    first, more = (SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 5))
    runs = []
    for _ in range(4):
        kernel.generate(prompts, first)
        prefill = kernel.last_logits().clone()
        tokens = [c.tokens for c in kernel.generate(prompts, more)]
        runs.append((prefill, kernel.last_logits().clone(), tokens))
    for launch, (prefill, decoded, tokens) in enumerate(runs[1:], 1):
        assert torch.equal(prefill, runs[0][0]), f"launch {launch}: the prefill's logits differ from launch 0's"
        assert torch.equal(decoded, runs[0][1]), f"launch {launch}: the last decode step's logits differ"
        assert tokens == runs[0][2]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eager_attention_scores_on_gpu(tmp_path):
    """Attention's scores rounded to bf16 before and after their scaling (`attention_bf16_scores`, off by
    default), as eager attention stores them, at batch 8."""
    config = dataclasses.replace(case_config(8), attention_bf16_scores=True)
    check_against_reference("llama3-8b", 8, config, tmp_path)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_prompt_splits_k_on_gpu(tmp_path):
    """A 128-token prompt gives the prefill step's projections fewer [64, 128] tiles than tasks (o_proj: 64
    for 256), so their K ranges split over the tasks (`prefill_splits`)."""
    check_against_reference("llama3-8b", 1, case_config(1), tmp_path, lengths=[128])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_512_token_prompt_on_128_row_tiles_on_gpu(tmp_path):
    """A kernel of 512 tokens a step (the batch-1 benchmark's) prefills on [128, 128] tiles (`prefill_rows`)."""
    config = dataclasses.replace(case_config(1), max_tokens_per_step=512, max_model_len=600)
    assert config.prefill_rows == 128
    check_against_reference("llama3-8b", 1, config, tmp_path, lengths=[512])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_prompt_on_64_row_tiles_in_a_kernel_of_128_on_gpu(tmp_path):
    """`short_prefill_tokens`: in a kernel whose prefill tiles have 128 rows (512 tokens a step), a 128-token
    prompt takes the 64-row tiles, QKV's too, with their K splits."""
    config = dataclasses.replace(case_config(1), max_tokens_per_step=512, max_model_len=600, short_prefill_tokens=128)
    assert config.short_prefill == 128
    check_against_reference("llama3-8b", 1, config, tmp_path, lengths=[128])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("length, field, on", [(1100, "epilogue_tma", True), (400, "epilogue_tma", True),
                                               (1100, "gated_tma", False)])
def test_prefill_epilogue_variants_on_gpu(length, field, on, tmp_path):
    """The prefill tiles' residuals and stores through tensor descriptors (`epilogue_tma`), their bulk stores
    waited for before each task signals; or gate/up's tiles a half at a time through pointers, as the other
    projections' (`gated_tma` off): a prompt of 1,100 tokens (128-row tiles, the last one part-filled) or 400
    (64-row tiles)."""
    config = dataclasses.replace(case_config(1), max_tokens_per_step=length, max_model_len=length + 16,
                                 **{field: on})
    check_against_reference("llama3-8b", 1, config, tmp_path, lengths=[length])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("step_keys", [True, False])
def test_prefill_attention_reads_the_steps_keys_through_descriptors_on_gpu(step_keys, tmp_path):
    """`attention_step_keys`: a prefill block reads its own step's keys and values from the rows the QKV epilogue
    also wrote them to, through tensor descriptors, and earlier steps' from the pages (off: all from the pages).
    Prompts of 700 and 90 tokens in steps of 256, every step's logits checked: the long one alone for two steps,
    then its last 188 tokens beside the short one's first 68, then the long one's first decode beside the short
    one's last 22 (which attend to its first 68), then the short one's decode."""
    config = dataclasses.replace(case_config(2), max_model_len=720, attention_step_keys=step_keys)
    check_every_step("llama3-8b", config, tmp_path, lengths=[700, 90], max_tokens=2)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tiles", ["WIDE", "NARROW", "chain"])
def test_gluon_prefill_in_the_host_driven_executor_on_gpu(tiles, tmp_path):
    """A prefill step's projections and attention in Gluon (codegen/gluon; QKV with its rotary and cache writes, on
    [128, 256] or [128, 128] tiles: two heads a tile or one; or every layer's groups as one persistent launch on
    [128, 256] tiles, `chain.prefill_chain`) in place of their Triton tasks, in the host-driven executor: prompts of
    700 and 260 tokens in one step, its logits and a decode step's after it within bf16 tolerance of the
    reference."""
    driver, model = gluon_driver(tmp_path, dataclasses.replace(case_config(2), max_tokens_per_step=1024,
                                                               max_model_len=1024), chain=tiles == "chain")
    if tiles == "chain":
        assert len(driver.gluon.chain_groups((960, 2))) == 6 * 32  # (the merge groups within it)
    else:
        driver.gluon.tiles = getattr(driver.gluon.linear, tiles)
    # QKV, attention, o_proj, gate/up, down; the LM head's fp32 logits are not, the merge groups have nothing to do
    assert len(driver.gluon.covered) == 5 * 32 and len(driver.gluon.merges) == 32
    assert list(driver.gluon.skipped.values()) == ["its outputs are not bf16 rows a multiple of 8 wide"]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (700, 260)]
    driver.generate(prompts, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    assert_within_bf16_tolerance(driver.kernel, model, prompts)
    out = driver.generate(prompts, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert_within_bf16_tolerance(driver.kernel, model, [p + c.tokens for p, c in zip(prompts, out)])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("chain", [False, True], ids=["groups", "chain"])
def test_gluon_attention_beside_decoding_sequences_on_gpu(chain, tmp_path):
    """Steps of 256 tokens that prefill one prompt's chunks beside another's and beside decoding sequences: the
    Gluon attention takes every sequence of such a step, the decoding ones too (a block each), and their merge group
    is not run (with `chain`, every layer's groups in one persistent launch). Prompts of 700 and 90 tokens, every
    step's logits checked (as `check_every_step`)."""
    driver, model = gluon_driver(tmp_path, dataclasses.replace(case_config(2), max_model_len=720), chain)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (700, 90)]
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for steps in range(1, 20):
        out = driver.generate(prompts, params, max_steps=steps)
        assert_within_bf16_tolerance(driver.kernel, model, [p + c.tokens for p, c in zip(prompts, out)])
        if all(c.finish_reason != "incomplete" for c in out):
            return
    raise AssertionError("the requests did not finish in 19 steps")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gluon_decode_attention_for_64_sequences_on_gpu(tmp_path):
    """64 prompts of 3 to 39 tokens: the prefill step's attention in 128-row items, then decode steps whose 512
    (sequence, KV head) pairs fill the GPU, in 64-row items on one consumer warp group (`attention.DECODE_LAUNCH`),
    the merge groups idle, and their projections stream-K (`linear.linear_prefill` and `qkv.qkv_prefill` with
    STREAM_K); the last decode step's logits within bf16 tolerance of the reference."""
    driver, model = gluon_driver(tmp_path, case_config(64))
    g = torch.Generator().manual_seed(64)
    lengths = torch.randint(3, 40, (64,), generator=g).tolist()
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    attention = [first for first, kind in driver.gluon.kinds.items() if kind == Kind.ATTENTION]
    assert len(attention) == 32 and all(driver.gluon.applies(first, (64, 64)) for first in attention)
    assert len(driver.gluon.streamk) == 4 * 32 and all(driver.gluon.takes_streamk(first, (64, 64))
                                                        for first in driver.gluon.streamk)
    out = driver.generate(prompts, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert_within_bf16_tolerance(driver.kernel, model, [p + c.tokens for p, c in zip(prompts, out)])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("batch", [8, 64])
def test_a_batched_decode_steps_layers_in_one_launch_on_gpu(batch, tmp_path):
    """Prompts of 3 to 39 tokens, then decode steps of every sequence, whose layers run as one persistent launch
    (`batch.batch_chain`: the projections stream-K, their first weights copied before the group before is done;
    decode attention, at batch 8 split, its 64 (sequence, KV head) pairs fewer than the SMs), then the decode steps
    after the first in the batched loop (the same over steps, each planned, embedded, its logits and greedy tokens on
    the GPU); the last decode step's logits within bf16 tolerance of the reference both ways (the tokens against the
    group kernels': printed, as sums in another order may pick another of random weights' flat logits)."""
    driver, model = gluon_driver(tmp_path, case_config(batch), True)
    assert len(driver.gluon.chain_groups((batch, batch))) >= 5 * 32
    g = torch.Generator().manual_seed(batch)
    lengths = torch.randint(3, 40, (batch,), generator=g).tolist()
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    out = driver.generate(prompts, params)
    assert_within_bf16_tolerance(driver.kernel, model, [p + c.tokens for p, c in zip(prompts, out)])
    looped = driver.generate(prompts, params, loop=True)  # (from the second decode step: `batch_chain` over steps)
    assert all(len(c.tokens) == 4 for c in looped)
    assert_within_bf16_tolerance(driver.kernel, model, [p + c.tokens for p, c in zip(prompts, looped)])
    driver.gluon.batch_chain = False
    groups = driver.generate(prompts, params)
    same, same_loop = (sum(a.tokens == b.tokens for a, b in zip(ours, groups)) for ours in (out, looped))
    print(f"the chain's tokens the group kernels' for {same} of {batch} requests, the loop's for {same_loop}")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_batched_loop_samples_on_gpu(tmp_path):
    """The batched loop's sampling with temperatures (`step.sample` over every sequence: each one's chunks, partials,
    ticket and cut scratch its own) draws the tokens the Triton sample tasks draw for the same requests and seeds (the
    host-driven executor's group kernels, after the same layers), one request greedy among them, and a seed's draws
    repeat bit for bit. (Top-k 1 at a temperature is not greedy here: random weights' bf16 logits tie at the top, and
    a draw among the tied need not be the first.)"""
    driver, model = gluon_driver(tmp_path, case_config(8), True)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (5, 17, 30, 9)]
    params = [SamplingParams(max_tokens=6, temperature=t, top_k=k, top_p=p, seed=7 + r, ignore_eos=True)
              for r, (t, k, p) in enumerate(((0.8, 50, 0.9), (0.0, 0, 1.0), (1.2, 1, 1.0), (0.5, 0, 0.8)))]
    looped = driver.generate(prompts, params, loop=True)
    assert [c.tokens for c in driver.generate(prompts, params, loop=True)] == [c.tokens for c in looped]
    assert all(len(c.tokens) == 6 for c in looped)
    assert [c.tokens for c in driver.generate(prompts, params)] == [c.tokens for c in looped]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("way", ["groups", "chain", "loop"])
def test_gluon_gemv_for_one_sequence_on_gpu(way, tmp_path):
    """One prompt of 200 tokens, then decode steps of its one row: every projection and the LM head in the GEMV
    (`gemv.linear_gemv`, units of 8, 16 or 32 weight rows, two programs an SM), QKV too (`gemv.qkv_gemv`: the unit
    that completes a head runs its rotary and cache write), the LM head's fp32 logits in the prefill step too (one
    sequence's last row), and attention with each KV head's keys in splits that the last to finish merges (`chain`:
    the prefill step's layers and each decode step's in one persistent launch each; `loop`: from the second decode
    step on, the steps back to back in one launch, each planned, embedded, run, its logits and greedy token on the
    GPU: `chain.decode_chain` over steps); every step's logits checked (as `check_every_step`), and the tokens."""
    driver, model = gluon_driver(tmp_path, case_config(1), way != "groups")
    if way != "groups":
        assert len(driver.gluon.chain_groups((1, 1))) == 6 * 32
    assert len(driver.gluon.one_row) == 4 * 32 + 1 and not driver.gluon.one_row_skipped
    prompt = torch.randint(0, model.config.vocab_size, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tokens = []
    for steps in range(1, 7):
        out = driver.generate([prompt], params, max_steps=steps, loop=way == "loop")
        assert out[0].tokens[:len(tokens)] == tokens and len(out[0].tokens) == steps
        tokens = out[0].tokens
        assert_within_bf16_tolerance(driver.kernel, model, [prompt + out[0].tokens])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("cut", [dict(), dict(top_k=50, top_p=0.9)], ids=["gumbel", "top_k_top_p"])
def test_gluon_loop_samples_as_the_triton_sampler_on_gpu(cut, tmp_path):
    """The one-row loop's sampling with a temperature (`step.sample`, `codegen/gluon/sampling.py`: Philox noise
    drawn by the token's index, the cut checked as `_draw_within` does) gives the tokens the Triton sample tasks give
    the same request and seed (the host-driven executor's group kernels)."""
    driver, model = gluon_driver(tmp_path, case_config(1), True)
    prompt = torch.randint(0, model.config.vocab_size, (200,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(max_tokens=8, temperature=0.8, seed=1234, ignore_eos=True, **cut)
    looped = driver.generate([prompt], params, loop=True)[0].tokens
    assert looped == driver.generate([prompt], params)[0].tokens and len(looped) == 8


def gluon_driver(tmp_path, config: CompileConfig, chain: bool = False):
    """Llama-3-8B (random weights) compiled with `config`, in the host-driven executor with the Gluon bodies (chain:
    a prefill step's as one persistent launch)."""
    if not PRECOMPILE and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon bodies are written for sm_90")
    from runtime.artifact import Artifact
    from runtime.host_driven import HostDriven, precompile
    model = resolve_model("llama3-8b")
    path = compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path
    precompile(Artifact.load(path))  # (its host-driven kernels: here, or into the cache with BLINK_GPU_PRECOMPILE)
    kernel = Megakernel.load(path, device="cuda", timeout_s=300)
    return HostDriven(kernel, gluon=True, chain=chain), model


def check_every_step(preset: str, config: CompileConfig, tmp_path, lengths: list[int], max_tokens: int) -> None:
    """Launches bounded to 1, 2, ... steps until every request has finished, each launch's last step checked
    against the reference (`assert_within_bf16_tolerance`)."""
    model = resolve_model(preset)
    kernel = Megakernel.load(compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path,
                             device="cuda", timeout_s=300)
    g = torch.Generator().manual_seed(len(lengths))
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for steps in range(1, sum(lengths) + len(lengths) * max_tokens + 1):
        out = kernel.generate(prompts, params, max_steps=steps)
        assert_within_bf16_tolerance(kernel, model, [p + c.tokens for p, c in zip(prompts, out)])
        if all(c.finish_reason != "incomplete" for c in out):
            return


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", [32, 64])
def test_decode_attention_key_blocks_on_gpu(block, tmp_path):
    """Batch 64 decodes 100 tokens in blocks of 32 or 64 keys (`decode_block_kv`: 64 by default where a decode
    task spans 2,048 keys or more), so that its contexts end one to three blocks long, the last one partial."""
    config = dataclasses.replace(case_config(64), decode_block_kv=block, max_new_tokens=128)
    check_against_reference("llama3-8b", 64, config, tmp_path, decode_tokens=100)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_long_batch_64_prefill_on_gpu(tmp_path):
    """64 prompts of 40 to 249 tokens (10,040) prefilled in one step: the step's plan is the prompts', launch after
    launch, and the logits match the reference after the prefill and after decoding. H200, session 28: the logits
    were wrong in 3 of 14 such checks, and the plan (token ids, positions, cache slots) in 4 of 12 launches,
    until the planner's warps waited for each other before a request's `cached` moved on (session 29). The
    cases above, whose prompts are 3 to 39 tokens, never showed it."""
    lengths = torch.randint(40, 250, (64,), generator=torch.Generator().manual_seed(7)).tolist()
    config = dataclasses.replace(case_config(64), max_tokens_per_step=sum(lengths))
    model = resolve_model("llama3-8b")
    kernel = Megakernel.load(compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path,
                             device="cuda", timeout_s=300)
    g = torch.Generator().manual_seed(64)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    want = expected_plan(prompts, once.max_tokens, config.page_size)
    for launch in range(20):
        kernel.generate(prompts, once)
        words = kernel.i32.cpu()
        for name, values in want.items():
            offset = kernel.region(name)[0]
            wrong = (words[offset:offset + len(values)] != values).nonzero().flatten().tolist()
            assert not wrong, f"launch {launch}: {len(wrong)} words of {name} wrong, from {wrong[0]}"
    del kernel  # its 18 GB of activations
    torch.cuda.empty_cache()
    (tmp_path / "reference").mkdir()
    check_against_reference("llama3-8b", 64, config, tmp_path / "reference", lengths=lengths)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_a_launch_past_its_timeout_is_stopped_and_says_where_it_waited_on_gpu(tmp_path):
    """A wait that is never met, under a spin limit that would outlast the host's timeout by far (2^28 polls):
    the host raises the abort flag after 2 s (`Megakernel._ask_to_stop`), the first wait to see it records where it
    was waiting, the kernel ends, and the next launch runs as before."""
    config = CompileConfig(max_batch=1, max_tokens_per_step=64, max_model_len=128, max_new_tokens=8,
                           spin_limit=1 << 28)
    model = resolve_model("tiny-llama")
    kernel = Megakernel.load(compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path,
                             device="cuda", timeout_s=2)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    expected = kernel.generate([[1, 2, 3]], params)[0].tokens
    launch = kernel.schedule  # the launch's task table (a group's tasks share their waits)
    saved = launch.clone()
    group = torch.nonzero(launch[:kernel.tasks.shape[0], 3] == launch[5, 3]).flatten()
    launch[group, 4:7] = torch.tensor([int(launch[5, 3]), 1000, 0], dtype=launch.dtype, device=launch.device)
    start = time.perf_counter()
    with pytest.raises(HangError, match=r"ran past 2 s and was stopped; in step 0, .* waited on event \d+"):
        kernel.generate([[1, 2, 3]], params)
    assert time.perf_counter() - start < 2 + STOP_GRACE_S
    launch.copy_(saved)
    assert kernel.generate([[1, 2, 3]], params)[0].tokens == expected


def expected_plan(prompts: list[list[int]], max_tokens: int, page_size: int) -> dict[str, torch.Tensor]:
    """The words a step that prefills every prompt whole plans: token ids, positions and cache slots, the
    requests' pages handed out in order (`Megakernel._write_requests`)."""
    ids, positions, slots, first_page = [], [], [], 0
    for prompt in prompts:
        pos = torch.arange(len(prompt), dtype=torch.int32)
        ids.append(torch.tensor(prompt, dtype=torch.int32))
        positions.append(pos)
        slots.append((first_page + pos // page_size) * page_size + pos % page_size)
        first_page += -(-(len(prompt) + max_tokens) // page_size)
    return {"input_ids": torch.cat(ids), "positions": torch.cat(positions), "slots": torch.cat(slots)}


def check_against_reference(preset: str, batch: int, config: CompileConfig, tmp_path,
                            lengths: list[int] | None = None, decode_tokens: int = 4,
                            gluon: bool | None = None) -> None:
    model = resolve_model(preset)
    out = compile_model(model, config, tmp_path / "model.cubin", WeightsSource(seed=1)).path
    kernel = Megakernel.load(out, device="cuda", timeout_s=300, gluon=gluon)
    g = torch.Generator().manual_seed(batch)
    if lengths is None:  # prompts of 3 to 39 tokens
        lengths = torch.randint(3, 40, (batch,), generator=g).tolist()
    prompts = [torch.randint(0, model.config.vocab_size, (int(n),), generator=g).tolist() for n in lengths]
    kernel.generate(prompts, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    assert_within_bf16_tolerance(kernel, model, prompts)
    out = kernel.generate(prompts, SamplingParams(max_tokens=decode_tokens, temperature=0, ignore_eos=True))
    assert_within_bf16_tolerance(kernel, model, [p + c.tokens for p, c in zip(prompts, out)])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_request_on_the_gluon_kernels_on_gpu(tmp_path):
    """`Megakernel._gluon` (`runtime.gluon.OneRequest`): one Llama-3-8B request through the runtime on the Gluon
    kernels, its prompt's chunks through the Gluon bodies (a step's layers as one persistent launch), its decode steps
    in the one-row loop, queued at once. Greedy, a prompt of two chunks: the prefill's logits and the last decode
    step's within bf16 tolerance of the reference, and the same tokens again; sampled with a temperature, top-k and
    top-p, the same tokens again for the same seed; every Gluon launch from the cubins compiled beside the kernel
    (`runtime.gluon_kernels`), none by the JIT. Not the compiled kernel's tokens: the Gluon sums are not its sums,
    and on random weights' flat logits a bf16 step moves a draw, or an argmax (session 66: greedy, the 7th of 8;
    `test_gluon_loop_samples_as_the_triton_sampler_on_gpu` checks the loop's sampler on equal logits)."""
    if not PRECOMPILE and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are written for sm_90")
    from runtime.artifact import Artifact
    from runtime.host_driven import precompile
    model = resolve_model("llama3-8b")
    path = compile_model(model, case_config(1), tmp_path / "model.cubin", WeightsSource(seed=1)).path
    precompile(Artifact.load(path))  # (its host-driven kernels: here, or into the cache with BLINK_GPU_PRECOMPILE)
    kernel = Megakernel.load(path, device="cuda", timeout_s=300, gluon=True)
    gluon = kernel.gluon
    from runtime.gluon_kernels import _KERNELS  # (compiled at the build, beside the kernel: not by the JIT)
    # (the counts this test's launches add: the process's other tests may have launched other variants by the JIT)
    before = {name: (k.launches_ahead, k.launches_jit) for name, k in _KERNELS.items()}
    g = torch.Generator().manual_seed(66)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompt = torch.randint(0, model.config.vocab_size, (300,), generator=g).tolist()
    assert gluon.steps([prompt], [greedy], 64) == ([256, 44], 62)
    out = kernel.generate([prompt], greedy, max_steps=2)[0]  # (the prefill's two steps)
    assert len(out.tokens) == 1
    assert_within_bf16_tolerance(kernel, model, [prompt + out.tokens])
    looped = kernel.generate([prompt], greedy)[0]
    assert len(looped.tokens) == 8 and looped.finish_reason == "length"
    assert_within_bf16_tolerance(kernel, model, [prompt + looped.tokens])
    assert kernel.generate([prompt], greedy)[0] == looped
    kernel.gluon = None
    alone = kernel.generate([prompt], greedy)[0]
    kernel.gluon = gluon
    print(f"\ngreedy: the Gluon kernels {looped.tokens}, the compiled kernel alone {alone.tokens}")
    prompt = torch.randint(0, model.config.vocab_size, (200,), generator=g).tolist()
    sampled = SamplingParams(max_tokens=8, temperature=0.8, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    out = kernel.generate([prompt], sampled)[0]
    assert len(out.tokens) == 8 and kernel.generate([prompt], sampled)[0] == out
    launches = {}
    for name, k in _KERNELS.items():
        ahead, jit = before.get(name, (0, 0))
        if (k.launches_ahead, k.launches_jit) != (ahead, jit):
            launches[k.fn.fn.__name__] = (k.launches_ahead - ahead, k.launches_jit - jit)
    print(f"Gluon launches (from the cache, by the JIT): {launches}")
    assert {"prefill_chain", "linear_gemv", "decode_chain"} <= launches.keys()
    assert all(ahead and not jit for ahead, jit in launches.values())


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_batch_on_the_gluon_kernels_on_gpu(tmp_path):
    """`runtime.gluon.Batch`: 8 Llama-3-8B requests through the runtime, a 300-token prompt among prompts of 3 to 39
    (two steps of the compiled kernel, 320 tokens a step: the long prompt and most of the next in the first, the
    others with the long one's first decode row in the second), then their decode steps in the batched loop queued
    behind, each request ending at its own max_tokens. Greedy: the last step's logits
    within bf16 tolerance of the reference, and the same tokens again; a request whose third token is made an EOS id
    stops there while the others go on; sampled with temperatures, top-k and top-p (one request greedy), a seed's
    tokens again; the loop's launches from the cubins compiled beside the kernel, none by the JIT; past the kernel's
    timeout, in the compiled kernel's steps or in the loop's, a `HangError` that says where, and the next batch runs
    as before."""
    if not PRECOMPILE and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are written for sm_90")
    from runtime.artifact import Artifact
    from runtime.gluon_kernels import _KERNELS
    from runtime.host_driven import precompile
    model = resolve_model("llama3-8b")
    path = compile_model(model, case_config(8), tmp_path / "model.cubin", WeightsSource(seed=1)).path
    precompile(Artifact.load(path))  # (its host-driven kernels: here, or into the cache with BLINK_GPU_PRECOMPILE)
    kernel = Megakernel.load(path, device="cuda", timeout_s=300)
    assert kernel.gluon_batch is not None and kernel.gluon_batch.max_requests == 8
    before = {name: (k.launches_ahead, k.launches_jit) for name, k in _KERNELS.items()}
    g = torch.Generator().manual_seed(73)
    lengths = [300] + torch.randint(3, 40, (7,), generator=g).tolist()
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    greedy = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (8, 8, 3, 8, 5, 8, 8, 1)]
    compiled, looped = kernel.gluon_batch.steps(prompts, greedy, 64)
    assert (compiled, looped) == (2, 8)  # (7 steps of a token a request, then the plan that finds them ended)
    out = kernel.generate(prompts, greedy)
    assert [len(c.tokens) for c in out] == [p.max_tokens for p in greedy]
    assert all(c.finish_reason == "length" for c in out)
    assert_within_bf16_tolerance(kernel, model, [p + c.tokens for p, c in zip(prompts, out)])
    assert kernel.generate(prompts, greedy) == out
    kernel.manifest["model"]["eos_token_ids"] = [out[1].tokens[2]]
    stopped = kernel.generate(prompts, [dataclasses.replace(p, ignore_eos=r != 1) for r, p in enumerate(greedy)])
    assert stopped[1].finish_reason == "stop" and stopped[1].tokens == out[1].tokens[:out[1].tokens.index(
        out[1].tokens[2]) + 1]
    assert [c.tokens for r, c in enumerate(stopped) if r != 1] == [c.tokens for r, c in enumerate(out) if r != 1]
    sampled = [SamplingParams(max_tokens=6, temperature=t, top_k=k, top_p=p, seed=7 + r, ignore_eos=True)
               for r, (t, k, p) in enumerate(((0.8, 50, 0.9), (0.0, 0, 1.0), (1.2, 0, 1.0), (0.5, 0, 0.8)) * 2)]
    drawn = kernel.generate(prompts, sampled)
    assert all(len(c.tokens) == 6 for c in drawn) and kernel.generate(prompts, sampled) == drawn
    launches = {name: (k.launches_ahead - before.get(name, (0, 0))[0], k.launches_jit - before.get(name, (0, 0))[1])
                for name, k in _KERNELS.items() if k.fn.fn.__name__ == "batch_chain"}
    print(f"\nthe batched loop's launches (from the cache, by the JIT): {launches}")
    assert sum(ahead for ahead, _ in launches.values()) == 5 and not any(jit for _, jit in launches.values())
    longest = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)  # (~50 ms: 2 steps, then 7 of the loop)
    for timeout_s in (0.002, 0.025):  # (in the compiled kernel's steps; at 25 ms, in the loop's)
        kernel.timeout_s = timeout_s
        with pytest.raises(HangError, match="^hang: .*stopped") as hang:
            kernel.generate(prompts, longest)
        print(hang.value)
        kernel.timeout_s = 300
        assert kernel.generate(prompts, greedy) == out


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("prompt_len, timeout_s", [(300, 0.002), (40, 0.015)])
def test_one_request_past_its_timeout_on_the_gluon_kernels_on_gpu(prompt_len, timeout_s, tmp_path):
    """One request on the Gluon kernels past the kernel's timeout (a timeout shorter than its launches, which stand in
    for a hang: the same path): the host says where it was (the prefill step that had not ended, or the loop's step
    and group from its counters: at 2 ms, whichever the host finds running once it has queued the launches), sets
    the stop words its waits poll, the launches end within the grace, and the next request runs as before."""
    if not PRECOMPILE and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon kernels are written for sm_90")
    from runtime.artifact import Artifact
    from runtime.host_driven import precompile
    model = resolve_model("llama3-8b")
    path = compile_model(model, case_config(1), tmp_path / "model.cubin", WeightsSource(seed=1)).path
    precompile(Artifact.load(path))
    kernel = Megakernel.load(path, device="cuda", timeout_s=300, gluon=True)
    prompt = torch.randint(0, model.config.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(9))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    expected = kernel.generate([prompt.tolist()], params)[0]
    kernel.timeout_s = timeout_s
    start = time.perf_counter()
    where = r"(prefill step \d \(the Gluon bodies\) did not end|the one-row loop did not end in .*: step \d+, group)"
    with pytest.raises(HangError, match=f"hang: {where}.*; stopped$") as raised:
        kernel.generate([prompt.tolist()], params)
    print(f"\n{raised.value} ({time.perf_counter() - start:.3f} s)")
    assert time.perf_counter() - start < timeout_s + STOP_GRACE_S
    kernel.timeout_s = 300
    assert kernel.generate([prompt.tolist()], params)[0] == expected
