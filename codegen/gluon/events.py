"""The persistent Gluon kernels' events (`chain.py`): a counter a group, which each program's consumers add one to
when their share of the group is done, so that the group after can start where it reads what this one wrote."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def wait(EVENTS, g, target):
    """Spins until EVENTS[g] reaches target (acquire: what its signals released is visible after), then orders this
    thread's later bulk copies (the async proxy's reads) after it; g < 0: no wait."""
    if g >= 0:
        seen = gl.atomic_add(EVENTS + g, 0, sem="acquire", scope="gpu")
        while seen < target:
            seen = gl.atomic_add(EVENTS + g, 0, sem="acquire", scope="gpu")
        gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, $1;", "=r,r", [seen], dtype=gl.int32,
                                  is_pure=False, pack=1)
