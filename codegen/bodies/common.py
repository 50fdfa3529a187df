"""Helpers shared by the task bodies: descriptor words, dtype rounding, step metadata."""
import triton
import triton.language as tl


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
