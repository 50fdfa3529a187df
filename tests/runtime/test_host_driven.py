"""The host-driven baseline launches one kernel per run of tasks that signal one event (a task group); how the
runtime runs one request on the Gluon kernels."""
from types import SimpleNamespace

from runtime.host_driven import contiguous_groups


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
    steps = lambda prompt_len, max_tokens, bound: OneRequest.steps(one, prompt_len, max_tokens, bound)  # noqa: E731
    assert steps(512, 8, 521) == ([512], 520)
    assert steps(513, 8, 522) == ([512, 1], 520) and steps(1100, 8, 1109) == ([512, 512, 76], 1106)
    assert steps(1100, 8, 2) == ([512, 512], 0)
    assert steps(20, 1, 22) == ([20], 0)


def test_the_interpreter_runs_without_the_gluon_kernels():
    """A kernel in the interpreter has no Gluon kernels and says why; asking for them is a clear error."""
    import pytest

    from runtime.megakernel import Megakernel

    probe = SimpleNamespace(interpret=True)
    assert Megakernel._gluon(probe, None) == (None, "the interpreter runs the Triton kernel alone")
    assert Megakernel._gluon(probe, False) == (None, "not asked for")
    with pytest.raises(ValueError, match="no Gluon kernels: the interpreter runs the Triton kernel alone"):
        Megakernel._gluon(probe, True)
