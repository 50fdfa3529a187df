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


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed with CUDA error {result}")


def carveout_percent(shared_per_program: int, programs_per_sm: int, shared_per_sm: int) -> int:
    """The smallest carveout, in percent of an SM's shared memory, that holds `programs_per_sm` programs."""
    needed = programs_per_sm * (shared_per_program + RESERVED_SHARED_PER_PROGRAM)
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
