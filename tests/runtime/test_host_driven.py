"""The host-driven baseline launches one kernel per run of tasks that signal one event (a task group)."""
from runtime.host_driven import _contiguous_groups


def test_one_launch_per_run_of_tasks_signalling_one_event():
    assert _contiguous_groups([3, 3, 3, 4, 5, 5]) == [(0, 3), (3, 1), (4, 2)]
    assert _contiguous_groups([7]) == [(0, 1)]
