"""Events: counters in global memory that only grow. A task waits until `counter >= count * (step + 1 - lag)`
and signals by adding one after its writes. A wait that spins past the limit records a hang and aborts."""
import triton
import triton.language as tl

# the kernel's source holds these bodies without their imports: codegen/layout.py's values, written out (a test
# checks that they agree): the control words step, error_flag (error_step .. error_target the five after it) and
# error_kind, and ABORT_HANG, ABORT_ASKED and ABORT_ASKED_RECORDED
STEP_WORD, ERROR_FLAG, ERROR_KIND = tl.constexpr(3), tl.constexpr(6), tl.constexpr(14)
HANG, ASKED, ASKED_RECORDED = tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)
# CompileConfig.poll_loads (the generated kernel sets this after the bodies): 0, a wait polls with acquiring atomics;
# 1 (the interpreter) or 2 (a GPU), with volatile loads, then acquires once the count is there, by an atomic (1) or
# by a fence (2: no second round trip to L2)
POLL_LOADS = tl.constexpr(0)


@triton.jit
def acquire_fence(x):
    """fence.acq_rel at GPU scope (after a volatile load that saw a release: what it released is visible after)."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def wait_event(EVENTS, I32, CONTROL: tl.constexpr, event, target, step, task, SPIN_LIMIT: tl.constexpr):
    """Returns 1 when the event reached `target`, 0 when it gave up (hang recorded, abort flag set)."""
    if POLL_LOADS > 0:
        seen = tl.load(EVENTS + event, volatile=True)
    else:
        seen = tl.atomic_add(EVENTS + event, 0, sem="acquire")
    spins = 0
    while (seen < target) & (spins < SPIN_LIMIT):
        if POLL_LOADS > 0:
            seen = tl.load(EVENTS + event, volatile=True)
        else:
            seen = tl.atomic_add(EVENTS + event, 0, sem="acquire")
        spins += 1
        if spins % 1024 == 0:
            if tl.load(I32 + CONTROL + ERROR_FLAG, volatile=True) != 0:  # another program aborted, or the host asked
                spins = SPIN_LIMIT
    if POLL_LOADS == 2:
        acquire_fence(seen)
    elif POLL_LOADS == 1:
        tl.atomic_add(EVENTS + event, 0, sem="acquire")
    ok = seen >= target
    if not ok:
        record_hang(I32, CONTROL, step, task, event, seen, target)
    tl.debug_barrier()
    return ok


@triton.jit
def record_hang(I32, CONTROL: tl.constexpr, step, task, event, seen, target):
    """The first wait to give up records where (`Megakernel._raise_on_hang` reports it), then raises the abort flag
    if the host has not: codegen/layout.py, ABORT_*. The record is taken before the flag is raised, so a wait that
    gives up on seeing a hang's flag finds it taken; a wait that saw the host's flag records that it did."""
    flag = I32 + CONTROL + ERROR_FLAG
    asked = tl.load(flag, volatile=True) == ASKED
    first = tl.atomic_cas(I32 + CONTROL + ERROR_KIND, 0, tl.where(asked, ASKED_RECORDED, HANG)) == 0
    tl.atomic_cas(flag, 0, HANG)
    if first:  # error_step, error_task, error_event, error_value, error_target
        tl.store(flag + 1, step)
        tl.store(flag + 2, task)
        tl.store(flag + 3, event)
        tl.store(flag + 4, seen)
        tl.store(flag + 5, target)


@triton.jit
def signal_event(EVENTS, event, count=1):
    tl.debug_barrier()  # every thread's writes happen before the release
    tl.atomic_add(EVENTS + event, count, sem="release")


@triton.jit
def l2_prefetch(base, stride_bytes, rows, row_bytes):
    """Threads 0 .. rows - 1 each ask L2 for `row_bytes` bytes at base + thread * stride_bytes (one bulk
    prefetch instruction per row: nothing to wait for, no registers held). GPU only (inline PTX)."""
    tl.inline_asm_elementwise(
        asm="""{
        .reg .pred p; .reg .b32 t; .reg .b64 a, o;
        mov.u32 t, %tid.x;
        setp.lt.u32 p, t, $3;
        mul.wide.u32 o, t, $2;
        add.s64 a, $1, o;
        @p cp.async.bulk.prefetch.L2.global [a], $4;
        mov.u32 $0, 0;
        }""",
        constraints="=r,l,r,r,r", args=[base, stride_bytes.to(tl.int32), rows.to(tl.int32), row_bytes.to(tl.int32)],
        dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def bulk_stores_done(x):
    """Waits until this thread's bulk tensor stores are written to global memory and orders them before its
    later accesses in the generic proxy, such as a signal's release (a descriptor store's own wait is only
    for its shared memory to be read). x: any int32 scalar, returned. GPU only (inline PTX)."""
    return tl.inline_asm_elementwise(
        asm="cp.async.bulk.wait_group 0; fence.proxy.async.global; mov.u32 $0, $1;", constraints="=r,r",
        args=[x.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
