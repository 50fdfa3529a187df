"""`python -m benchmarks.explore.aot_ab`: one request on the Gluon kernels, their cubins compiled ahead of time
(`runtime/gluon_kernels.py`) against Triton's JIT compiling them at the launch, A / B / A in one process: the batch-1
TPOT at context 512 and the first token of a 512-token prompt (`benchmarks.megakernel_tpot`'s measures). The JIT
specialises integer arguments on their values (a multiple of 16: a divisibility hint) where the ahead-of-time
cubins take them as plain int32s."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.megakernel_tpot import artifact_path, decode_config, tpot_ms, ttft_config, ttft_ms
from blinkc.compile_model import WeightsSource, compile_model
from models.registry import resolve_model
from runtime import gluon_kernels
from runtime.megakernel import Megakernel


def by_jit(on: bool) -> None:
    """Every Gluon launch by the JIT (on) or from the cache's cubins (off)."""
    gluon_kernels.folder = _nowhere if on else _folder
    for kernel in gluon_kernels._KERNELS.values():
        kernel._loaded.clear()


_folder = gluon_kernels.folder


def _nowhere(*args, **kwargs) -> Path:
    return Path("/nonexistent")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="A / B / A ... rounds")
    args = parser.parse_args()
    model = resolve_model("llama3-8b")
    print(f"device {torch.cuda.get_device_name()}; llama3-8b, random weights", flush=True)
    rows = {}
    for name, config, measure in (("TPOT b1 ctx512", decode_config(1, 512, 22), lambda k: tpot_ms(k, 1, 512, 16)),
                                  ("TTFT 512 (GPU)", ttft_config(512), lambda k: ttft_ms(k, 512)[1])):
        path = compile_model(model, config, artifact_path(name.split()[0].lower()), WeightsSource(seed=0)).path
        kernel = Megakernel.load(path, device="cuda", gluon=True)
        for r in range(args.rounds):
            jit = r % 2 == 1
            by_jit(jit)
            measure(kernel)  # (a JIT compile, then warm)
            rows.setdefault(name, []).append(("JIT" if jit else "ahead", measure(kernel)))
        by_jit(False)
        counts = {k.fn.fn.__name__: (k.launches_ahead, k.launches_jit) for k in gluon_kernels._KERNELS.values()}
        print(f"{name} ms: " + " / ".join(f"{how} {ms:.3f}" for how, ms in rows[name]) +
              f"  (launches ahead, by the JIT: {counts})", flush=True)
        del kernel
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
