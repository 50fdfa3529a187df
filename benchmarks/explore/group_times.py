"""Baseline (c) group by group: each task group's kernel time when the same bodies run as one kernel per group
from a CUDA graph (torch.profiler over graph replays), per layer, next to nothing else. Compare with
`benchmarks.profile_step` (the megakernel's critical path per group) to see which groups the persistent
kernel loses on. GPU only.

    python -m benchmarks.explore.group_times --batch 1 --context 512
"""
from __future__ import annotations

import argparse
import re
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.decode import capture_decode_step, load_kernel
from benchmarks.megakernel_tpot import artifact_path, decode_config
from runtime.host_driven import HostDriven


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--replays", type=int, default=5)
    args = parser.parse_args()
    kernel = load_kernel(args.preset, decode_config(args.batch, args.context, 16), artifact_path("groups"))
    driver = HostDriven(kernel)
    graph = capture_decode_step(driver, args.batch, args.context, args.replays + 4)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type.name == "CUDA" and "_group" in e.name),
                    key=lambda e: e.time_range.start)
    names = [kernel.manifest["events"][int(kernel.tasks[first, 3])] for first, _ in driver.groups]
    per_replay = len(driver.groups)
    print(f"{len(events)} group kernels profiled, {per_replay} a replay")
    if len(events) != per_replay * args.replays:
        print("unexpected kernel count: the profile does not show each graph node")
        return
    times, gaps = defaultdict(list), defaultdict(list)
    for i, e in enumerate(events):
        name = re.sub(r"\.\d+", ".L", re.sub(r"layers\.\d+", "layers.L", names[i % per_replay]))
        times[name].append(e.time_range.elapsed_us())
        if i % per_replay:
            gaps[name].append(e.time_range.start - events[i - 1].time_range.end)
    total = (events[-1].time_range.end - events[0].time_range.start) / args.replays
    print(f"step {total:.0f} us (from the first kernel's start to the last's end, per replay)")
    print("group | kernels | median us | median gap before us")
    for name, ts in times.items():
        g = sorted(gaps.get(name, [0]))
        print(f"{name} | {len(ts)} | {sorted(ts)[len(ts) // 2]:.1f} | {g[len(g) // 2]:.1f}")


if __name__ == "__main__":
    main()
