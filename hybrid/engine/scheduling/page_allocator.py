"""Pages of the shared latent KV cache: who holds which (no torch; the scheduler's bookkeeping).

The cache is one pool of `num_pages` pages of `page_size` token slots, shared by every layer's
cache tensor (slot s of a page lives at row page * page_size + s in each layer). A request
holds the pages it was admitted with until it ends, so a page is never shared and never moves.
Invariant: every page id is either free or held by exactly one request.
"""

from __future__ import annotations

from hybrid.errors import HybridError


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise HybridError(f"a KV cache needs pages: got {num_pages} of {page_size} tokens")
        self.num_pages, self.page_size = num_pages, page_size
        # LIFO: a just-freed page (warm in caches) is handed out first.
        self._free = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Pages for `num_tokens` slots, or None (and nothing taken) when too few are free."""
        n = self.pages_for(num_tokens)
        if n > len(self._free):
            return None
        taken = self._free[len(self._free) - n:]
        del self._free[len(self._free) - n:]
        return taken[::-1]

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))
        assert len(self._free) <= self.num_pages, "a page was freed twice"
