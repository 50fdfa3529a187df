"""Helpers shared by the task bodies: descriptor words, dtype rounding, step metadata."""
import triton
import triton.language as tl

from codegen.bodies.sync import ERROR_FLAG, STEP_WORD, record_hang

# The norms' sums of squares in fp64 (`CompileConfig.exact_norm_sums`; the generated kernel sets this after the
# bodies, codegen/templates/megakernel.py.j2), else fp32. Every column tile of a value adds its rows' partial sums by
# atomics, in an order that varies from launch to launch: in fp32 the sum's last bits vary with it.
NORM_SUMS_F64 = tl.constexpr(False)
SPLIT_SLICE_ROWS = tl.constexpr(0)  # CompileConfig.split_slice_rows (`split_slices`)
NARROW_ROWS = tl.constexpr(0)  # CompileConfig.narrow_batch_rows where fewer than the kernel's batched rows
SHORT_PREFILL = tl.constexpr(0)  # CompileConfig.short_prefill_tokens where the prefill tiles have more than 64 rows
EPILOGUE_TMA = tl.constexpr(False)  # CompileConfig.epilogue_tma (`store_outputs`)
GATED_TMA = tl.constexpr(False)  # CompileConfig.gated_tma (`dot_block`)
STEP_KEYS = tl.constexpr(False)  # CompileConfig.attention_step_keys (`head_epilogue`, `prefill_rows`)
INLINE_PTX = tl.constexpr(False)  # the kernel runs on a GPU, not in the interpreter (which cannot run inline PTX)
CONTROL_WORDS = tl.constexpr(0)  # the control words' offset in I32 (codegen/layout.py), for waits inside a body
SPIN_LIMIT = tl.constexpr(1 << 26)  # CompileConfig.spin_limit, for waits inside a body
SPLIT_TICKET = tl.constexpr(-2)  # a hang's task word where `split_slices` gave up (codegen/layout.py HANG_SPLIT_TICKET)


@triton.jit
def word(desc, index: tl.constexpr):
    """Descriptor word `index` (int64)."""
    return tl.load(desc + index)


@triton.jit
def word8(desc, index: tl.constexpr):
    """Descriptor word `index`, promised to be a multiple of 8 (offsets and widths of rows, which the
    lowering checks): it lets the compiler prove 16-byte alignment and vectorise the loads."""
    return tl.multiple_of(tl.load(desc + index), 8)


@triton.jit
def word_f32(desc, index: tl.constexpr):
    """A float stored as the bits of a float64 in word `index`."""
    return tl.load(desc + index).to(tl.float64, bitcast=True).to(tl.float32)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """Rounds fp32 values to `dtype` and back, as storing them would."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def row_halves(acc):
    """The first and last half of acc's rows: an epilogue over 128 rows of a tile a half at a time, since its
    loads and addresses for every row at once spill (Llama-3-8B's projection bodies alone: 664 against 920 B
    of stack a thread)."""
    R: tl.constexpr = acc.shape[0]
    return tl.split(tl.permute(tl.reshape(acc, (2, R // 2, acc.shape[1])), (1, 2, 0)))


@triton.jit
def arrives_last(ticket, count):
    """Takes a ticket (a counter the planner zeroes every step) once every thread's writes are done, and
    returns whether this task is the last of `count` to arrive: the release publishes its writes, the
    acquire lets the last one read everyone's."""
    tl.debug_barrier()
    arrived = tl.atomic_add(ticket, 1.0, sem="acq_rel")
    tl.debug_barrier()
    return arrived == count - 1


@triton.jit
def prefill_splits(tiles, num_tasks, K, parts, ticket_off, SPLITS: tl.constexpr, BK: tl.constexpr):
    """K splits of each of a prefill group's `tiles` tiles: SPLITS where set, else as many as give each of
    the group's `num_tasks` tasks at most one split, each at least 8 chunks of BK; never more than the
    scratch's `parts` hold, and none where the group may not split (ticket_off < 0)."""
    if SPLITS > 0:
        splits = tl.full((), SPLITS, tl.int64)
    else:
        splits = tl.minimum(tl.minimum(parts, num_tasks) // tiles, K // (8 * BK))
    splits = tl.minimum(splits, parts // tiles)
    return tl.where(ticket_off >= 0, tl.maximum(splits, 1), 1)


@triton.jit
def store_split(F32, part_off, ticket_off, block, split, splits, acc):
    """Split-K for wide blocks: stores split `split` of block `block`'s fp32 partial acc [R, C] (a block holds
    `splits` parts of R x C) and takes a ticket (a counter the planner zeroes every step). Returns whether
    this split arrived last (it then zeroes the ticket again, for a later group of the step that shares the
    tickets) and where the block's parts start: the last one sums them a few rows at a time
    (`sum_split_rows`), so that no second [R, C] accumulator competes with the first for registers."""
    R: tl.constexpr = acc.shape[0]
    C: tl.constexpr = acc.shape[1]
    base = tl.multiple_of(part_off + block * splits * (R * C), 16)  # 16 floats: 16 bytes a thread's store
    tl.store(F32 + base + split * (R * C) + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :], acc)
    last = arrives_last(F32 + ticket_off + block, splits)
    if last:
        tl.store(F32 + ticket_off + block, 0.0)
    return last, base


@triton.jit
def sum_split_rows(F32, base, splits, r0, R: tl.constexpr, C: tl.constexpr, ROWS: tl.constexpr):
    """Rows r0 .. r0 + ROWS of the `splits` parts [R, C] at `base` (see `store_split`), summed in order."""
    parts = F32 + tl.multiple_of(base, 16) + (tl.arange(0, ROWS) + r0)[:, None] * C + tl.arange(0, C)[None, :]
    total = tl.zeros((ROWS, C), tl.float32)
    for s in range(0, splits):
        total += tl.load(parts + s * (R * C))
    return total


@triton.jit
def split_slices(F32, I32, part_off, ticket_off, block, split, splits, acc, num_rows, SLICE: tl.constexpr):
    """Split-K in slices of SLICE rows: stores split `split` of block `block`'s fp32 partial acc [R, C] (a block
    holds `splits` parts of R x C), takes the block's ticket (a counter the planner zeroes every step), and
    returns where the block's parts start and the slices this split finishes: `first`, `first + step`, ...
    below the step's `num_rows` rows, each summed over the splits in order (`sum_split_rows`) and finished by
    the caller. Where the rows make two slices or more and the launch has a program for every split, each
    split waits for the others and takes slices split, split + splits, ...; else the last to arrive takes them
    all. (Every split reaches its ticket: a task that waits here holds its program, and the block's other
    splits are running or taken after it in order by programs that are not waiting here, since only the block
    taken last can lack a split. So the wait runs out only where the kernel is aborting, a wait elsewhere having
    given up, or after SPIN_LIMIT spins: a hang it records as task SPLIT_TICKET's, with the block for the event.)"""
    R: tl.constexpr = acc.shape[0]
    C: tl.constexpr = acc.shape[1]
    base = tl.multiple_of(part_off + block * splits * (R * C), 16)  # 16 floats: 16 bytes a thread's store
    tl.store(F32 + base + split * (R * C) + tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :], acc)
    ticket = F32 + ticket_off + block
    tl.debug_barrier()
    arrived = tl.atomic_add(ticket, 1.0, sem="acq_rel").to(tl.int32)  # releases this split's partial
    slices = tl.cdiv(num_rows, SLICE).to(tl.int32)
    first = tl.where(arrived == splits - 1, 0, slices)
    step = tl.full((), 1, tl.int32)
    if (slices >= 2) & (splits <= tl.num_programs(0)):
        seen, spins = arrived + 1, 0
        while (seen < splits) & (spins < SPIN_LIMIT):
            seen = tl.atomic_add(ticket, 0.0, sem="acquire").to(tl.int32)
            spins += 1
            if spins % 1024 == 0:
                if tl.load(I32 + CONTROL_WORDS + ERROR_FLAG, volatile=True) != 0:  # a wait elsewhere gave up: aborting
                    spins = SPIN_LIMIT
        if seen < splits:
            record_hang(I32, CONTROL_WORDS, tl.load(I32 + CONTROL_WORDS + STEP_WORD), SPLIT_TICKET, block, seen,
                        splits)
        first = split.to(tl.int32)
        step = splits.to(tl.int32)
    tl.debug_barrier()
    return base, first, step


@triton.jit
def sum_of_splits(F32, part_off, ticket_off, block, split, splits, acc, rows, ROWS: tl.constexpr):
    """Split-K: stores split `split` of block `block`'s fp32 partial acc [rows, C] (each block holds `splits`
    parts of ROWS x C) and takes a ticket (a counter the planner zeroes every step). Returns whether this
    split arrived last and, if so, every split's partial summed in order (zeros otherwise)."""
    C: tl.constexpr = acc.shape[1]
    # 16-float aligned (the region is, and ROWS x C is a multiple of 16): 16 bytes a thread's load and store
    base = tl.multiple_of(part_off + block * splits * (ROWS * C), 16)
    parts = F32 + base + rows[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(parts + split * (ROWS * C), acc)
    last = arrives_last(F32 + ticket_off + block, splits)
    total = tl.zeros(acc.shape, tl.float32)
    if last:
        for s in range(0, splits):
            total += tl.load(parts + s * (ROWS * C))
    return last, total


@triton.jit
def norm_sums(F32, off):
    """The rows' sums of squares at F32 word `off` (`NORM_SUMS_F64`: two words a row)."""
    if NORM_SUMS_F64:
        return (F32 + off).to(tl.pointer_type(tl.float64), bitcast=True)
    else:
        return F32 + off


@triton.jit
def add_norm_sums(F32, off, rows, row_ok, y, mask):
    """Adds the sums of squares of y's rows (of its elements where `mask`) into the rows' sums at F32 word `off`
    (`norm_sums`)."""
    sums = norm_sums(F32, off)
    tl.atomic_add(sums + rows, tl.sum(tl.where(mask, y * y, 0.0), 1).to(sums.dtype.element_ty), mask=row_ok)
