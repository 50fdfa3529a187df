"""The host-driven baseline launches one kernel per run of tasks that signal one event (a task group); how the
runtime runs one request, and a batch, on the Gluon kernels."""
from types import SimpleNamespace

from runtime.host_driven import contiguous_groups
from runtime.sampling import SamplingParams


def test_one_launch_per_run_of_tasks_signalling_one_event():
    assert contiguous_groups([3, 3, 3, 4, 5, 5]) == [(0, 3), (3, 1), (4, 2)]
    assert contiguous_groups([7]) == [(0, 1)]


def test_the_baseline_inlines_every_body(tmp_path):
    """Baseline (c) runs one task a CTA: nothing to hoist out of a loop, so no body is a function of its own."""
    from runtime.host_driven import _inlined

    source = tmp_path / "kernel.py"
    source.write_text("@triton.jit(noinline=True)\ndef a():\n    pass\n\n\n@triton.jit\ndef b():\n    pass\n")
    text = _inlined(source).read_text()
    assert "noinline" not in text and text.count("@triton.jit\ndef ") == 2
    assert _inlined(source) == _inlined(source)  # one file per source text


def test_one_request_on_the_gluon_kernels_prefills_a_chunk_a_step_then_loops():
    """`OneRequest.steps`: a prompt's chunks of `max_tokens_per_step` a prefill step each, then the loop's steps (none
    for a single token; a launch bounded by `max_steps` stops within the chunks)."""
    from runtime.gluon import OneRequest

    one = SimpleNamespace(kernel=SimpleNamespace(config=SimpleNamespace(max_tokens_per_step=512)))

    def steps(prompt_len, max_tokens, bound):
        return OneRequest.steps(one, [[0] * prompt_len], [SamplingParams(max_tokens=max_tokens)], bound)

    assert steps(512, 8, 521) == ([512], 520)
    assert steps(513, 8, 522) == ([512, 1], 520) and steps(1100, 8, 1109) == ([512, 512, 76], 1106)
    assert steps(1100, 8, 2) == ([512, 512], 0)
    assert steps(20, 1, 22) == ([20], 0)


def test_a_batch_on_the_gluon_kernels_loops_once_every_request_only_decodes():
    """`steps_before_decoding` follows the kernel's planner (each request in turn takes what is left of a step's
    budget, up to its prompt's rest or one token) to the first step in which every request left brings one token,
    and counts the steps of one token a request after it; `Batch.steps` runs the steps before it on the compiled
    kernel, the rest and the plan that finds every request ended in the batched loop (none where every request has
    ended by then, and none past a launch's bound)."""
    from runtime.gluon import Batch, steps_before_decoding

    assert steps_before_decoding([3, 1, 2], [4, 4, 4], 8) == (1, 3)  # (6 tokens in step 0; then one each)
    assert steps_before_decoding([1, 1], [4, 2], 2) == (0, 4)  # (one-token prompts: the loop from step 0)
    # 19 + 3 + 3 tokens at 16 a step: step 0 takes 16 of the first prompt, step 1 its last 3 and both others whole
    assert steps_before_decoding([19, 3, 3], [6, 6, 6], 16) == (2, 5)
    # the second and third prompts wait while the first takes each step's budget whole (steps 0 and 1); the second
    # takes 15 in step 2, beside the first's decode row; both end their prompts in step 3
    assert steps_before_decoding([32, 20, 5], [9, 9, 9], 16) == (4, 8)
    assert steps_before_decoding([19, 3, 3], [1, 1, 1], 16) == (2, 0)  # (each ends at its first token)
    assert steps_before_decoding([19, 3, 3], [1, 2, 1], 16) == (2, 1)  # (one token left for the second)
    batch = SimpleNamespace(kernel=SimpleNamespace(config=SimpleNamespace(max_tokens_per_step=16)))
    prompts, params = [[0] * 19, [0] * 3, [0] * 3], [SamplingParams(max_tokens=6)] * 3
    assert Batch.steps(batch, prompts, params, 26) == (2, 6)
    assert Batch.steps(batch, prompts, params, 5) == (2, 3) and Batch.steps(batch, prompts, params, 1) == (1, 0)
    assert Batch.steps(batch, prompts, [SamplingParams(max_tokens=1)] * 3, 26) == (2, 0)


def test_the_interpreter_runs_without_the_gluon_kernels():
    """A kernel in the interpreter has no Gluon kernels and says why; asking for them is a clear error."""
    import pytest

    from runtime.megakernel import Megakernel

    probe = SimpleNamespace(interpret=True)
    assert Megakernel._gluon(probe, None) == (None, None, "the interpreter runs the Triton kernel alone")
    assert Megakernel._gluon(probe, False) == (None, None, "not asked for")
    with pytest.raises(ValueError, match="no Gluon kernels: the interpreter runs the Triton kernel alone"):
        Megakernel._gluon(probe, True)
