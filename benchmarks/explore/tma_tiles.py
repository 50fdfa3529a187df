"""The prefill tiles' K loop ([64, 128] products over 64-column chunks, 3 stages, 4 warps) compiled for sm_90
on the CPU (Triton's bundled ptxas) two ways: `cp.async` copies of masked pointer tiles, as the megakernel's
`dot_product` loads today, and Hopper bulk tensor copies through descriptors made in the kernel
(`tl.make_tensor_descriptor`). Prints each loop's instruction count and what the TMA form asks of the launch
(global scratch for the descriptors). A probe for the next change, not part of the kernel:

    python -m benchmarks.explore.tma_tiles
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def tiles(X, W, OUT, M, N, K, num_tiles, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          STAGES: tl.constexpr, TMA: tl.constexpr):
    for t in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        m0 = (t % tl.cdiv(M, BM)) * BM
        n0 = (t // tl.cdiv(M, BM)) * BN
        rows, cols = m0 + tl.arange(0, BM), n0 + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), tl.float32)
        if TMA:  # out-of-bounds rows and columns read as zeros: no masks
            xd = tl.make_tensor_descriptor(X, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
            wd = tl.make_tensor_descriptor(W, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
            for k0 in tl.range(0, K, BK, num_stages=STAGES):
                acc = tl.dot(xd.load([m0, k0]), tl.trans(wd.load([n0, k0])), acc)
        else:
            for k0 in tl.range(0, K, BK, num_stages=STAGES):
                ks = k0 + tl.arange(0, BK)
                k_ok = (ks < K)[None, :]
                x = tl.load(X + rows[:, None] * K + ks[None, :], mask=(rows < M)[:, None] & k_ok, other=0.0)
                w = tl.load(W + cols[:, None] * K + ks[None, :], mask=(cols < N)[:, None] & k_ok, other=0.0)
                acc = tl.dot(x, tl.trans(w), acc)
        tl.store(OUT + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16),
                 mask=(rows < M)[:, None] & (cols < N)[None, :])


def loop_sizes(sass: str) -> list[int]:
    """Instructions in each backward-branching loop that holds a wgmma."""
    code = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    sizes = []
    for address, op in code:
        target = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", op)
        if target and int(target.group(1), 16) < address:
            body = [o for a, o in code if int(target.group(1), 16) <= a <= address]
            if any("HGMMA" in o for o in body):
                sizes.append(len(body))
    return sizes


def main() -> None:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    signature = {"X": "*bf16", "W": "*bf16", "OUT": "*bf16", "M": "i32", "N": "i32", "K": "i32", "num_tiles": "i32",
                 "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "STAGES": "constexpr", "TMA": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 5)}
    for tma in (False, True):
        constants = {"BM": 64, "BN": 128, "BK": 64, "STAGES": 3, "TMA": tma}
        kernel = triton.compile(ASTSource(tiles, signature, constants, aligned), target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": 4})
        path = Path(f"/tmp/tma_tiles_{int(tma)}.cubin")
        path.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(cuobjdump), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
        print(f"{'TMA descriptors' if tma else 'cp.async':>15}: loops of {loop_sizes(sass)} instructions, "
              f"{sass.count('UTMALDG')} UTMALDG, {sass.count('LDGSTS')} LDGSTS, {kernel.metadata.shared} B shared, "
              f"{kernel.metadata.global_scratch_size} B global scratch a program")


if __name__ == "__main__":
    main()
