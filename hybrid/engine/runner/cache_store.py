"""Finished prompts' and requests' transformers caches, kept for later requests that start with
the same tokens (a chat's next turn, the same system prompt): the prefix cache of a model that
runs through transformers' forward (transformers_runner.py), where no paged cache is shared.

A cache holding the first L tokens of a sequence is exactly the state after those L tokens, so a
request whose prompt begins with all L of them continues from a copy of it and computes only the
rest. Only whole entries match: a cache cannot be cut back to a shorter prefix, so the runner
keeps one at the end of each prompt (the part a next turn repeats even where its template
re-renders the reply) and one at the end of each request. Least recently used entries go first
once `max_entries` or `max_tokens` is passed.
"""

from __future__ import annotations

import copy
from collections import OrderedDict


class CacheStore:
    def __init__(self, max_entries: int, max_tokens: int) -> None:
        self.max_entries, self.max_tokens = max_entries, max_tokens
        self._entries: OrderedDict[tuple[int, ...], object] = OrderedDict()  # tokens -> cache
        self.tokens = 0  # held, over all entries

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: list[int], cache: object) -> None:
        """Keep `cache` (holding exactly `tokens`; the store owns it from now on)."""
        key = tuple(tokens)
        if not key or len(key) > self.max_tokens or self.max_entries < 1:
            return
        if key in self._entries:  # the same tokens give the same state: keep the one held
            self._entries.move_to_end(key)
            return
        self._entries[key] = cache
        self.tokens += len(key)
        while len(self._entries) > self.max_entries or self.tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self.tokens -= len(old)

    def take(self, prompt: list[int], limit: int) -> tuple[object, int] | None:
        """(a copy of the longest held cache whose tokens begin `prompt`, its length), that
        length at most `limit`; None without one."""
        best: tuple[int, ...] | None = None
        for key in self._entries:
            if len(key) <= limit and (best is None or len(key) > len(best)) \
                    and tuple(prompt[:len(key)]) == key:
                best = key
        if best is None:
            return None
        self._entries.move_to_end(best)
        return copy.deepcopy(self._entries[best]), len(best)
