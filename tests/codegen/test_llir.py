"""codegen/llir.py: the LLVM stage that pins thread-id reads where the lowering put them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from codegen.llir import pin_thread_ids

ROOT = Path(__file__).resolve().parents[2]

# a persistent loop whose body needs index math of two layouts; compiled for sm_90 (Triton's bundled ptxas)
# in a process of its own, since the tests run Triton as the interpreter
TOY = '''
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from codegen.llir import pinned_thread_ids

@triton.jit
def toy(x_ptr, y_ptr, n_tasks, BLOCK: tl.constexpr):
    for t in range(tl.program_id(0), n_tasks, tl.num_programs(0)):
        cells = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
        tile = tl.load(x_ptr + t * BLOCK * BLOCK + cells)
        tl.store(y_ptr + t * BLOCK + tl.arange(0, BLOCK), tl.sum(tile, axis=1))

for pin in (False, True):
    src = ASTSource(toy, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n_tasks": "i32", "BLOCK": "constexpr"}, {"BLOCK": 32})
    with pinned_thread_ids(pin):
        lines = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"].splitlines()
    loop = next(i for i, line in enumerate(lines) if line.startswith("$L__BB"))
    print(pin, sum("%tid.x" in line for line in lines[:loop]), sum("%tid.x" in line for line in lines[loop:]))
'''


def test_every_thread_id_read_becomes_an_asm_with_side_effects():
    text = ("%3 = nvvm.read.ptx.sreg.tid.x : i32\n  %4 = llvm.add %3, %2 : i32\n"
            "%17 = nvvm.read.ptx.sreg.tid.x : i32\n  %18 = nvvm.read.ptx.sreg.ctaid.x : i32")
    pinned, count = pin_thread_ids(text)
    assert count == 2 and "sreg.tid" not in pinned and "nvvm.read.ptx.sreg.ctaid.x" in pinned
    assert pinned.count('%3 = llvm.inline_asm has_side_effects asm_dialect = att "mov.u32 $0, %tid.x;"') == 1
    assert "%4 = llvm.add %3, %2 : i32" in pinned


def test_pinned_reads_stay_in_the_loop_where_triton_hoists_them_out(tmp_path):
    (tmp_path / "toy.py").write_text(TOY)  # Triton reads a kernel's source from its file
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(tmp_path / "toy.py")], capture_output=True, text=True, timeout=240,
                            env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    (_, before, inside), (_, _, pinned_inside) = (line.split() for line in result.stdout.splitlines())
    assert (int(before), int(inside)) == (1, 0)  # Triton's stage: one read, at entry, its index math hoisted
    assert int(pinned_inside) >= 2  # pinned: the body reads the thread id itself, a read per layout
