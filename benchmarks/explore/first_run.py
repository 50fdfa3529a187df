"""`python -m benchmarks.explore.first_run MODEL.cubin`: where a first `blinkc run` goes, one request on the Gluon
kernels: the imports, the load (weights placed, kernels loaded), and each of three generations of 32 tokens (or as
many as the kernel takes), host to host. Run it with an empty TRITON_CACHE_DIR, then again: what the first run pays
that a second does not is what Triton compiles at run time (its launchers' C stubs, anything the JIT compiles)."""
from __future__ import annotations

import sys
import time

start = time.perf_counter()
import torch  # noqa: E402

from runtime.megakernel import Megakernel  # noqa: E402
from runtime.sampling import SamplingParams  # noqa: E402


def main() -> None:
    imported = time.perf_counter()
    kernel = Megakernel.load(sys.argv[1])
    torch.cuda.synchronize()
    loaded = time.perf_counter()
    print(f"imports {imported - start:.2f} s, load {loaded - imported:.2f} s (Gluon: {kernel.no_gluon or 'on'})",
          flush=True)
    params = SamplingParams(max_tokens=min(32, kernel.config.max_new_tokens), temperature=0, ignore_eos=True)
    for i in range(3):
        began = time.perf_counter()
        kernel.generate([list(range(100, 110))], params)
        print(f"generation {i + 1}: {time.perf_counter() - began:.2f} s", flush=True)
    from runtime.gluon_kernels import _KERNELS
    print({k.fn.fn.__name__: (k.launches_ahead, k.launches_jit) for k in _KERNELS.values()})


if __name__ == "__main__":
    main()
