"""Triton's TTGIR -> LLVM IR stage with every thread-id read pinned where the lowering put it.

Why. Triton lowers each layout's index math (thread-id bit fields, shared-memory swizzle addresses) from a read
of `%tid.x` at the op that needs it. MLIR's CSE then merges all those reads into the first, in the kernel's
entry block, and LLVM's loop-invariant code motion hoists everything computed from it out of the persistent
task loop. The kernel then holds one set of index math for every layout of every body, for its whole life;
ptxas spills most of it, and every task reloads its share from the stack (~170 KB an SM, more than L1).

Pinned, each read is an `asm sideeffect` (PTX `mov.u32 %r, %tid.x`) that neither CSE nor LICM may move, so a
body computes its index math where it runs (a few integer instructions) and nothing outlives it. Llama-3-8B,
sm_90: 976 -> 416 B of spills a thread with rows,small,decode_attention outlined; with every body inlined (the
default from then to session 57, when the GEMV and few-row bodies were outlined again), 936 -> 432.

The stage mirrors `CUDABackend.make_llir` of Triton 3.6.0 (pinned in pyproject.toml): the same passes, split
after the TritonGPU -> LLVM conversion so the reads can be replaced before CSE sees them. Instrumentation,
the concurrency sanitizer and ASan, which the kernel never uses, are left out.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

import triton
import triton.knobs as knobs
from triton._C.libtriton import ir, llvm, nvidia, passes
from triton.backends.nvidia import compiler as cuda

TRITON_VERSION = "3.6.0"  # the make_llir this stage mirrors
_TID_READ = re.compile(r"(%[\w#]+) = nvvm\.read\.ptx\.sreg\.tid\.x : i32")
_PINNED_READ = r'\1 = llvm.inline_asm has_side_effects asm_dialect = att "mov.u32 $0, %tid.x;", "=r"  : () -> i32'


def pin_thread_ids(mlir_text: str) -> tuple[str, int]:
    """The LLVM-dialect module's text with every `nvvm.read.ptx.sreg.tid.x` an asm with side effects; and how
    many there were."""
    return _TID_READ.subn(_PINNED_READ, mlir_text)


def _make_llir(backend, src, metadata, options, capability):
    ptx_version = cuda.get_ptx_version_from_options(options, backend.target.arch)
    pm = ir.pass_manager(src.context)
    pm.enable_debug()
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, capability, ptx_version)
    nvidia.passes.ttnvgpuir.add_allocate_tensor_memory(pm)
    nvidia.passes.ttnvgpuir.add_check_matmul_two_cta(pm)
    passes.ttgpuir.add_allocate_global_scratch_memory(pm)
    nvidia.passes.ttnvgpuir.add_proxy_fence_insertion(pm, capability)
    nvidia.passes.ttgpuir.add_to_llvmir(pm, capability, ptx_version)
    pm.run(src, "make_llir")

    # the split: the module through text, its thread-id reads pinned (Triton's own cache reads IR the same way)
    text, _ = pin_thread_ids(str(src))
    with tempfile.TemporaryDirectory(prefix="blink-llir-") as tmp:
        path = Path(tmp) / "kernel.llvm.mlir"
        path.write_text(text)
        mod = ir.parse_mlir_module(str(path), src.context)
    mod.context = src.context

    pm = ir.pass_manager(mod.context)
    pm.enable_debug()
    passes.common.add_canonicalizer(pm)
    passes.common.add_cse(pm)
    nvidia.passes.ttnvgpuir.add_nvgpu_to_llvm(pm)
    nvidia.passes.ttnvgpuir.add_warp_specialize_to_llvm(pm)
    passes.common.add_canonicalizer(pm)
    passes.common.add_cse(pm)
    passes.common.add_symbol_dce(pm)
    passes.convert.add_nvvm_to_llvm(pm)
    if not knobs.compilation.disable_line_info:
        passes.llvmir.add_di_scope(pm)
    pm.run(mod, "make_llir")

    llvm.init_targets()
    context = llvm.context()
    llvm_mod = llvm.to_module(mod, context)
    nvidia.set_short_ptr()
    llvm.attach_datalayout(llvm_mod, "nvptx64-nvidia-cuda", cuda.sm_arch_from_capability(capability),
                           cuda.get_features(options, backend.target.arch))
    if options.enable_reflect_ftz:
        nvidia.set_nvvm_reflect_ftz(llvm_mod)
    if options.extern_libs and nvidia.has_extern_deps(llvm_mod):
        llvm.link_extern_libs(llvm_mod, [path for _, path in options.extern_libs])
    llvm.optimize_module(llvm_mod, llvm.OPTIMIZE_O3)

    # the metadata make_llir records, read from the first half's module as Triton reads it from `src`
    total_num_warps = src.get_int_attr("ttg.total-num-warps")
    if total_num_warps is not None:
        metadata["num_warps"] = total_num_warps
    metadata["shared"] = src.get_int_attr("ttg.shared")
    metadata["tmem_size"] = src.get_int_attr("ttg.tensor_memory_size")
    metadata["global_scratch_size"] = src.get_int_attr("ttg.global_scratch_memory_size")
    metadata["global_scratch_align"] = src.get_int_attr("ttg.global_scratch_memory_alignment")
    metadata["profile_scratch_size"] = src.get_int_attr("ttg.profile_scratch_memory_size") or 0
    metadata["profile_scratch_align"] = src.get_int_attr("ttg.profile_scratch_memory_alignment") or 1
    return str(llvm_mod)


def _hook(backend, stages, options, language, capability) -> None:
    stages["llir"] = lambda src, metadata: _make_llir(backend, src, metadata, options, capability)


@contextlib.contextmanager
def pinned_thread_ids(enabled: bool = True):
    """Within: `triton.compile` lowers to LLVM IR with pinned thread-id reads, caching its output apart from
    Triton's usual cache (whose key knows nothing of the stage)."""
    if not enabled:
        yield
        return
    if triton.__version__ != TRITON_VERSION:
        raise RuntimeError(f"pin_thread_ids mirrors Triton {TRITON_VERSION}'s LLVM stage, found Triton "
                           f"{triton.__version__}; compile with pin_thread_ids=0")
    with knobs.runtime.scope(), knobs.cache.scope():
        knobs.runtime.add_stages_inspection_hook = _hook
        knobs.cache.dir = os.path.join(knobs.cache.dir, "pinned-thread-ids")
        yield
