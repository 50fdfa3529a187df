"""The host-driven baseline launches one kernel per run of tasks that signal one event (a task group); when the
runtime hands one request's decode steps to the Gluon loop."""
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


def test_the_decode_loop_takes_one_request_from_its_first_decode_step():
    """`Megakernel._handover`: one request with tokens to decode hands its steps after the prompt's chunks (one a
    step of `max_tokens_per_step`) to the decode loop; a batch, a single token, or a launch that ends within the
    prompt's chunks stay in the compiled kernel, as does everything where there is no loop."""
    from runtime.megakernel import Megakernel
    from runtime.sampling import SamplingParams

    kernel = SimpleNamespace(loop=object(), config=SimpleNamespace(max_tokens_per_step=512))
    handover = lambda prompts, max_tokens, steps: Megakernel._handover(  # noqa: E731
        kernel, prompts, SamplingParams(max_tokens=max_tokens), steps)
    assert handover([[1] * 512], 8, 521) == 1
    assert handover([[1] * 513], 8, 522) == 2 and handover([[1] * 1024], 8, 1033) == 2
    assert handover([[1] * 513], 8, 2) is None  # (`max_steps`: the launch ends with the prompt)
    assert handover([[1] * 20], 1, 22) is None
    assert handover([[1] * 20, [2] * 20], 8, 49) is None
    kernel.loop = None
    assert handover([[1] * 20], 8, 29) is None


def test_the_interpreter_runs_without_the_decode_loop(tmp_path):
    """A kernel in the interpreter has no decode loop and says why; asking for one is a clear error."""
    import pytest

    from runtime.megakernel import Megakernel

    probe = SimpleNamespace(interpret=True)
    assert Megakernel._decode_loop(probe, None) == (None, "the interpreter runs the Triton kernel alone")
    assert Megakernel._decode_loop(probe, False) == (None, "not asked for")
    with pytest.raises(ValueError, match="no decode loop: the interpreter runs the Triton kernel alone"):
        Megakernel._decode_loop(probe, True)
