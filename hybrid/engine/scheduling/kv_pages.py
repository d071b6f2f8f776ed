"""The pages of the shared latent KV cache (no torch; the scheduler's bookkeeping): who holds
each (`PageAllocator`) and which full pages requests share by prefix (`PrefixCache`).

The cache is one pool of `num_pages` pages of `page_size` token slots, shared by every layer's
cache tensor (slot s of a page lives at row page * page_size + s in each layer). A request
holds the pages it was admitted with until it ends, so a page never moves.

The prefix cache is a radix tree of pages: a node is one full page of `page_size` tokens, keyed
by those tokens under its parent (the page before it), so a path from the root is a token
prefix and its pages hold that prefix's KV (positions are absolute, so equal prefixes have
equal KV). A request's full pages are published into the tree as soon as their KV is computed
(prompt and generated tokens alike); a new request is admitted with the longest published
prefix of its prompt (never its whole prompt: the last token must run to give logits) and
computes only the rest.

Reference counts: every request holding a page counts once (its publisher included), so a page
is never freed or reused while a request holds it. A page no request holds stays cached, idle,
until the allocator needs it: idle leaves are evicted least recently used first (a parent only
after its children), all within the same page pool (`--cache-lens`).

Invariant: every page id is free, or held by exactly one request and unpublished, or a node of
the tree (without the prefix cache: free or held by exactly one request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(eq=False)
class _Node:
    page: int
    key: tuple[int, ...]
    parent: _Node | None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    refs: int = 0
    last_used: int = 0


class PrefixCache:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._root = _Node(-1, (), None)
        self._nodes: dict[int, _Node] = {}  # page id -> its node
        self._clock = 0
        # id(request) -> (full pages published so far, the last one's node)
        self._published: dict[int, tuple[int, _Node]] = {}
        self.num_evicted = 0  # pages evicted so far

    @property
    def num_pages(self) -> int:
        """Pages in the tree (held by requests or idle)."""
        return len(self._nodes)

    @property
    def num_idle(self) -> int:
        """Pages in the tree no request holds: evictable."""
        return sum(1 for n in self._nodes.values() if n.refs == 0)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _key(self, tokens: list[int], i: int) -> tuple[int, ...]:
        return tuple(tokens[i * self.page_size:(i + 1) * self.page_size])

    def match(self, tokens: list[int], limit: int) -> list[int]:
        """The pages of the longest published prefix of `tokens` within its first `limit`
        tokens, whole pages only; each is now held once more (release() gives them back)."""
        node, pages, now = self._root, [], self._tick()
        for i in range(limit // self.page_size):
            node = node.children.get(self._key(tokens, i))
            if node is None:
                break
            node.refs += 1
            node.last_used = now
            pages.append(node.page)
        return pages

    def num_published(self, request_id: int) -> int:
        """Full pages of the request already in the tree (or found there taken)."""
        return self._published.get(request_id, (0, None))[0]

    def publish(self, request_id: int, tokens: list[int], pages: list[int],
                num_computed: int) -> None:
        """Add the request's full pages with computed KV to the tree (resuming where it left
        off). A page whose prefix is already there under another page stays the request's own
        (freed when it ends); the ones after it still join the tree."""
        done, node = self._published.get(request_id, (0, self._root))
        full = min(num_computed // self.page_size, len(pages))
        now = self._tick()
        for i in range(done, full):
            key = self._key(tokens, i)
            child = node.children.get(key)
            if child is None and pages[i] not in self._nodes:
                child = _Node(pages[i], key, node, refs=1, last_used=now)
                node.children[key] = child
                self._nodes[pages[i]] = child
            elif child is None:  # cannot happen: a page sits in the tree once, by its prefix
                raise AssertionError(f"page {pages[i]} is in the tree under another prefix")
            node = child
        if full > done:
            self._published[request_id] = (full, node)

    def release(self, request_id: int, pages: list[int]) -> list[int]:
        """The request lets go of `pages`; returns those that are not in the tree (to free)."""
        self._published.pop(request_id, None)
        own, now = [], self._tick()
        for p in pages:
            node = self._nodes.get(p)
            if node is None:
                own.append(p)
            else:
                node.refs -= 1
                node.last_used = now
                assert node.refs >= 0, f"page {p} released more often than held"
        return own

    def evict(self, count: int) -> list[int]:
        """Up to `count` idle pages out of the tree, least recently used leaves first."""
        out: list[int] = []
        while len(out) < count:
            leaves = [n for n in self._nodes.values() if n.refs == 0 and not n.children]
            if not leaves:
                break
            leaves.sort(key=lambda n: n.last_used)
            for n in leaves[:count - len(out)]:
                del n.parent.children[n.key]
                del self._nodes[n.page]
                out.append(n.page)
        self.num_evicted += len(out)
        return out
