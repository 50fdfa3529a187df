"""Registers, spills, shared memory and pipelined loads of the megakernel, with all or some task kinds, on
the CPU (Triton's bundled ptxas, sm_90): which body sets the kernel's register count, and did Triton's
pipeliner stage a loop's loads (a loop it gave up on has no `async_copy_global_to_local` in the TTGIR).

    python scripts/kernel_resources.py llama3-8b                  # the whole kernel
    python scripts/kernel_resources.py llama3-8b --kinds LINEAR   # only the projection bodies
    python scripts/kernel_resources.py llama3-8b --set block_k=1024 --keep /tmp/k   # also keep ttgir/ptx/cubin
    python scripts/kernel_resources.py llama3-8b --set outline= --keep /tmp/k   # every body inlined
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import tempfile
from pathlib import Path

import codegen.render as render
from benchmarks.megakernel_tpot import parse_field
from blinkc.build import build_graph
from codegen.compile import CUOBJDUMP, compile_kernel, resource_usage
from codegen.config import CompileConfig
from codegen.kernel_abi import KERNEL_NAME
from codegen.lower import lower
from codegen.tasks import Kind
from models.registry import resolve_model
from runtime.artifact import import_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--kinds", default="", help="comma-separated task kinds to keep in the dispatch")
    parser.add_argument("--set", action="append", default=[], help="CompileConfig field=value (an integer or a string)")
    parser.add_argument("--keep", help="directory for the source, TTGIR and cubin")
    args = parser.parse_args()
    config = dataclasses.replace(CompileConfig(max_batch=1),
                                 **{k: parse_field(v) for k, v in (s.split("=", 1) for s in args.set)})
    kinds = {Kind[k] for k in args.kinds.split(",") if k}
    lowered = lower(build_graph(resolve_model(args.model), config), config)
    dispatch = render._dispatch
    render._dispatch = lambda lw, f32: [(k, call) for k, call in dispatch(lw, f32) if not kinds or Kind(k) in kinds]
    out = Path(args.keep or tempfile.mkdtemp(prefix="blink-resources-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.py").write_text(render.render_kernel(lowered, args.model))
    fn = getattr(import_source(out / "kernel.py"), KERNEL_NAME)
    compiled = compile_kernel(fn, "bf16", 90, config.num_warps, config.max_registers, config.pin_thread_ids)
    (out / "kernel.ttgir").write_text(compiled.asm["ttgir"])
    (out / "kernel.cubin").write_bytes(compiled.asm["cubin"])
    (out / "kernel.ptx").write_text(compiled.asm["ptx"])
    used = resource_usage(out / "kernel.cubin")
    # ptxas says when it serializes the kernel's wgmma (a dot body compiled as a function of its own does it)
    log = subprocess.run([str(CUOBJDUMP.with_name("ptxas")), "-v", "--gpu-name=sm_90a", str(out / "kernel.ptx"),
                          "-o", str(out / "ptxas.cubin")], capture_output=True, text=True).stderr
    for line in log.splitlines():
        if "Performance Loss" in line:
            print(line.split(": ", 1)[-1])
    staged = compiled.asm["ttgir"].count("async_copy_global_to_local")
    print(f"{args.model} [{args.kinds or 'all kinds'}]: {used.registers} registers, {used.stack_bytes} B stack "
          f"(spills), {compiled.metadata.shared} B shared memory (Triton's), {staged} pipelined loads in the "
          f"TTGIR; files in {out}")


if __name__ == "__main__":
    main()
