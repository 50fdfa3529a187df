"""Does a decode step right after a big prefill run slower than one in steady decode? The decode benchmark's TPOT is
the median of the 16 steps that follow the batch's prefill (`megakernel_tpot.tpot_ms`); a 64 x 512-token prefill
is a second of compute at the GPU's power cap, and the clocks it leaves behind may take a while to come back.
This prints every full-batch decode step of one `generate` in order (its kernel's step log), so a trend over the
steps shows it, and the median of the first 16 against the last 16.

    python -m benchmarks.explore.settle --batch 64 --context 512      # on an H100 / H200
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks import baselines
from benchmarks.decode import GRAPH_REPLAYS, load_kernel
from benchmarks.megakernel_tpot import artifact_path, decode_config
from models.registry import resolve_model
from runtime.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=GRAPH_REPLAYS + 2,
                        help="full-batch steps the kernel has room for (22: the decode benchmark's kernel)")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds idle between the warm-up and the run")
    parser.add_argument("--torch", type=int, default=0, help="then the torch graph's step (baseline (b)) replayed "
                        "this many times back to back: the median of its first and last fifty")
    args = parser.parse_args()
    kernel = load_kernel(args.preset, decode_config(args.batch, args.context, args.steps), artifact_path("settle"))
    prompts = [torch.randint(0, 1000, (args.context,)).tolist() for _ in range(args.batch)]
    params = SamplingParams(max_tokens=kernel.config.max_new_tokens, ignore_eos=True, temperature=0)
    for run in range(2):
        if run:
            time.sleep(args.pause)
        kernel.generate(prompts, params)
        log = kernel.step_log()
        steps = [((end - start) / 1e6, tokens) for (start, tokens, seqs), (end, _, _) in zip(log, log[1:])]
        prefill = sum(ms for ms, tokens in steps if tokens != args.batch)
        full = [ms for ms, tokens in steps if tokens == args.batch]
        print(f"run {run}: the prefill's steps {prefill:.0f} ms; {len(full)} full-batch steps (ms): "
              f"{' '.join(f'{ms:.2f}' for ms in full)}", flush=True)
        if len(full) >= 32:
            print(f"  median of the first 16 {statistics.median(full[:16]):.3f} ms, of the last 16 "
                  f"{statistics.median(full[-16:]):.3f}", flush=True)
    if args.torch:
        del kernel
        device = torch.device("cuda")
        baselines.release_memory(device)
        with torch.inference_mode():
            graph, _ = baselines.capture_graph(baselines.make_decode_step(resolve_model(args.preset).config,
                                                                          args.batch, args.context, device))
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(args.torch + 1)]
            marks[0].record()
            for n in range(args.torch):
                graph.replay()
                marks[n + 1].record()
            marks[-1].synchronize()
        times = [marks[n].elapsed_time(marks[n + 1]) for n in range(args.torch)]
        print(f"the torch graph, {args.torch} replays back to back: median {statistics.median(times):.3f} ms; the "
              f"first fifty {statistics.median(times[:50]):.3f}, the last fifty {statistics.median(times[-50:]):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
