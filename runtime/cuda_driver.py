"""The CUDA driver calls the launch needs beyond what Triton's loader makes: the split of each SM's
L1/shared-memory array, and how many programs fit co-resident under it.

Triton's loader asks for the largest shared-memory carveout (`CU_FUNC_CACHE_PREFER_SHARED`) as soon as a
kernel uses more than 48 KB of shared memory, which leaves each H100 SM about 28 KB of L1: the
megakernel's spilled registers then live in L2, and every phase slowed ~17% the one time we crossed 48 KB
(b1 6.98 -> 8.19 ms). `reserve_shared_memory` asks for just what the co-resident programs need instead.
"""
from __future__ import annotations

import ctypes
import functools

CU_FUNC_CACHE_PREFER_NONE = 0
CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 9
RESERVED_SHARED_PER_PROGRAM = 1024  # the driver's own shared memory in every block (sm_80 and later)
# the shared-memory sizes an sm_90 SM's 256 KB L1/shared array can be split at, in KB (CUDA C++ Programming
# Guide, compute capability 9.0); the rest is L1
SM90_SPLITS_KB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed with CUDA error {result}")


def carveout_percent(shared_per_program: int, programs_per_sm: int, shared_per_sm: int) -> int:
    """The carveout, in percent of an SM's shared memory, that gets the smallest split holding `programs_per_sm`
    programs. The driver rounds a percentage up to the next split it supports, so on an sm_90 SM (228 KB) the
    percentage aims at that split itself: one rounded up from the bytes needed can pass it (2 x 99,360 B fit
    196 KB, 200,704 B, but 86% is 200,786 B, and the driver gave 228 KB, leaving 28 KB of L1 instead of 60: ncu,
    H200, the spills' L1 hit rate 99.9% at 164 KB, 54% at 228). Elsewhere, the percentage of the bytes needed."""
    needed = programs_per_sm * (shared_per_program + RESERVED_SHARED_PER_PROGRAM)
    if shared_per_sm == SM90_SPLITS_KB[-1] * 1024:
        split = next((kb * 1024 for kb in SM90_SPLITS_KB if kb * 1024 >= needed), None)
        if split is not None:  # the split's own percentage rounded down, so that it rounds up to the split
            return 100 * split // shared_per_sm
    return min(100, -(-100 * needed // shared_per_sm))


def reserve_shared_memory(function: int, percent: int) -> None:
    """Asks the driver to give `percent` of the SM's L1/shared array to shared memory, the rest to L1."""
    lib, handle = _libcuda(), ctypes.c_void_p(function)
    _check(lib.cuFuncSetCacheConfig(handle, CU_FUNC_CACHE_PREFER_NONE), "cuFuncSetCacheConfig")
    _check(lib.cuFuncSetAttribute(handle, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, ctypes.c_int(percent)),
           "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")


def max_active_programs(function: int, threads: int, dynamic_shared: int) -> int:
    """Programs of `function` one SM holds at once, under its registers, shared memory and carveout."""
    count = ctypes.c_int()
    _check(_libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(count), ctypes.c_void_p(function), ctypes.c_int(threads), ctypes.c_size_t(dynamic_shared)),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return count.value
