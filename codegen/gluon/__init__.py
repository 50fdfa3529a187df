"""Task bodies in Gluon: warp-specialized kernels for Hopper (sm_90), the port of the megakernel's bodies.

Gluon (Triton's lower-level dialect) gives a kernel partitions of its own: a loader warp that streams operands into
a ring of shared memory by TMA, consumer warp groups that multiply on `wgmma`, each with its own register budget
(`setmaxnreg`). The plain-Triton bodies share one register allocation and one warp group across every body, which
is where sessions 36-58 found the kernel's limit (benchmarks/explore/NOTES.md, session 59, measured what this
structure reaches body by body). The bodies land here one at a time, each a kernel for a whole task group that the
host-driven executor (runtime/host_driven.py) launches in place of the Triton group kernel, checked there against
it; then persistent kernels of them (`chain.py`: a prefill step's layers; a one-row step's, and the loop over such
steps, planned and sampled on the GPU), on which the runtime runs one request on a Hopper GPU (runtime/gluon.py,
compiled ahead of time: `compile_ahead`). Gluon has no interpreter: the Triton bodies stay the CPU oracle, and these
are compiled for sm_90 in CI (`compile_for_sm90`) and run on the GPU only.
"""
from __future__ import annotations

from codegen.kernel_abi import Resources


def compile_for_sm90(fn, signature: dict[str, str], constexprs: dict, num_warps: int, maxnreg: int,
                     counts: dict | None = None) -> Resources:
    """Compiles the Gluon kernel fn for sm_90 on any machine (ptxas ships with Triton: no GPU needed) and returns its
    registers and stack a thread and its shared memory a program (the dynamic allocation, the rings' and barriers').
    signature: the runtime arguments' Triton types (pointers are taken 16-byte aligned, as the arenas are). counts:
    given, it takes the PTX's global loads and stores of 8 or 16 bytes ("vector_accesses"), which a pointer of unknown
    alignment leaves none of (the batched chain's, session 78)."""
    import re
    import tempfile
    from pathlib import Path

    from codegen.compile import resource_usage

    compiled = compile_ahead(fn, signature, constexprs, num_warps, maxnreg)
    if counts is not None:
        counts["vector_accesses"] = len(re.findall(r"\b(?:ld|st)\.global[\w.:]*?\.v[24]\.", compiled.asm["ptx"]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(compiled.asm["cubin"])
        usage = resource_usage(path)
    return Resources(usage.registers, usage.stack_bytes, compiled.metadata.shared)


def compile_ahead(fn, signature: dict[str, str], constexprs: dict, num_warps: int, maxnreg: int,
                  unaligned: frozenset[str] = frozenset(), arch: int = 90):
    """Triton's CompiledKernel of the Gluon kernel fn for sm_arch, compiled on any machine: its runtime arguments
    typed by `signature` (in fn's order, then the constexprs' values), the pointers taken 16-byte aligned but those
    named in `unaligned`, integers not specialised on their values."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    aligned = {(i, ): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
               if kind.startswith("*") and name not in unaligned}
    src = GluonASTSource(fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs,
                         attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "maxnreg": maxnreg})
