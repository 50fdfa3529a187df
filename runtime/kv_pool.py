"""The pool of KV-cache pages and the page tables of the sequences that hold them."""
from __future__ import annotations

from collections import deque


class PagePool:
    """Free-list allocator over `num_pages` pages of `page_size` tokens (vLLM's block manager, minus sharing)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError("num_pages and page_size must be positive")
        self.num_pages, self.page_size = num_pages, page_size
        self._free: deque[int] = deque(range(num_pages))
        self._is_free = [True] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= len(self._free)

    def allocate(self, num_pages: int) -> list[int]:
        if not self.can_allocate(num_pages):
            raise MemoryError(f"KV pool exhausted: {num_pages} pages wanted, {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(num_pages)]
        for page in pages:
            self._is_free[page] = False
        return pages

    def deallocate(self, pages: list[int]) -> None:
        for page in pages:
            if self._is_free[page]:
                raise ValueError(f"page {page} freed twice")
            self._is_free[page] = True
        self._free.extend(pages)

    def grow(self, pages: list[int], num_tokens: int) -> None:
        """Extends a sequence's page list in place so that it holds `num_tokens` tokens."""
        pages.extend(self.allocate(max(0, self.pages_for(num_tokens) - len(pages))))
