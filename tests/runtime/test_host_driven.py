"""The host-driven baseline launches one kernel per run of tasks that signal one event (a task group)."""
from runtime.host_driven import _contiguous_groups


def test_one_launch_per_run_of_tasks_signalling_one_event():
    assert _contiguous_groups([3, 3, 3, 4, 5, 5]) == [(0, 3), (3, 1), (4, 2)]
    assert _contiguous_groups([7]) == [(0, 1)]


def test_the_baseline_inlines_every_body(tmp_path):
    """Baseline (c) runs one task a CTA: nothing to hoist out of a loop, so no body is a function of its own."""
    from runtime.host_driven import _inlined

    source = tmp_path / "kernel.py"
    source.write_text("@triton.jit(noinline=True)\ndef a():\n    pass\n\n\n@triton.jit\ndef b():\n    pass\n")
    text = _inlined(source).read_text()
    assert "noinline" not in text and text.count("@triton.jit\ndef ") == 2
    assert _inlined(source) == _inlined(source)  # one file per source text
