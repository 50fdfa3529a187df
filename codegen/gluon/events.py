"""The persistent Gluon kernels' events (`chain.py`): a counter a group, which each program's consumers add one to
when their share of the group is done, so that the group after can start where it reads what this one wrote; and
before the counters, a word the host sets to stop a launch that has hung (`runtime.host_driven.HostDriven.run_loop`)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


STOP_POLL = gl.constexpr(4096)  # spins between two looks at the host's stop word


@gluon.jit
def wait(EVENTS, g, target):
    """Spins until EVENTS[g] reaches target (acquire: what its signals released is visible after), then orders this
    thread's later bulk copies (the async proxy's reads) after it; g < 0: no wait. Gives up once the host's stop word,
    EVENTS[-1], is set (`stopped`): the program then runs on through what is left of its work, unsynchronised, so that
    the launch ends and the GPU is free again (its outputs are garbage; the host reports where it stopped)."""
    if g >= 0:
        seen = gl.atomic_add(EVENTS + g, 0, sem="acquire", scope="gpu")
        spins = 0
        while seen < target:
            seen = gl.atomic_add(EVENTS + g, 0, sem="acquire", scope="gpu")
            spins += 1
            if spins % STOP_POLL == 0:
                if stopped(EVENTS):
                    seen = target
        gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, $1;", "=r,r", [seen], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def stopped(EVENTS):
    """Whether the host has set its stop word (the int32 before the counters)."""
    return gl.load(EVENTS - 1, volatile=True) != 0
