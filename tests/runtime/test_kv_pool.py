"""runtime.kv_pool.PagePool: allocation from the free list, growth of a page list, exhaustion."""
from __future__ import annotations

import pytest

from runtime.kv_pool import PagePool


@pytest.mark.parametrize("num_pages, page_size", [(0, 4), (5, 0), (-1, 3)])
def test_sizes_must_be_positive(num_pages, page_size):
    with pytest.raises(ValueError, match="must be positive"):
        PagePool(num_pages, page_size)


def test_pages_for_rounds_up():
    pool = PagePool(7, 5)
    assert [pool.pages_for(n) for n in (0, 1, 5, 6, 10, 11)] == [0, 1, 1, 2, 2, 3]


def test_allocate_and_deallocate():
    pool = PagePool(7, 3)
    first, second = pool.allocate(3), pool.allocate(2)
    assert len(first) == 3 and len(second) == 2 and not set(first) & set(second)
    assert set(first) | set(second) <= set(range(7))
    assert pool.num_free == 2
    pool.deallocate(first)
    assert pool.num_free == 5
    assert sorted(pool.allocate(5)) == sorted(set(range(7)) - set(second))
    assert pool.num_free == 0


def test_can_allocate_matches_allocate():
    pool = PagePool(5, 2)
    pool.allocate(3)
    assert pool.can_allocate(0) and pool.can_allocate(2) and not pool.can_allocate(3)


def test_exhaustion_raises_memory_error_and_takes_nothing():
    pool = PagePool(5, 2)
    held = pool.allocate(4)
    with pytest.raises(MemoryError, match="2 pages wanted, 1 free"):
        pool.allocate(2)
    assert pool.num_free == 1
    pool.deallocate(held)
    assert sorted(pool.allocate(5)) == list(range(5))


def test_grow_extends_in_place_only_when_needed():
    pool = PagePool(9, 4)
    pages = pool.allocate(1)
    original = pages
    pool.grow(pages, 4)
    assert len(pages) == 1 and pool.num_free == 8
    pool.grow(pages, 5)
    assert len(pages) == 2 and pages is original
    pool.grow(pages, 13)
    assert len(pages) == 4 and len(set(pages)) == 4 and pool.num_free == 5
    pool.grow(pages, 2)  # never shrinks
    assert len(pages) == 4


def test_grow_past_the_pool_raises_and_keeps_the_pages():
    pool = PagePool(3, 4)
    pages = pool.allocate(1)
    with pytest.raises(MemoryError):
        pool.grow(pages, 17)
    assert len(pages) == 1 and pool.num_free == 2
