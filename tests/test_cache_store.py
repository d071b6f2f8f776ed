"""The whole-cache prefix store of a model run through transformers' forward
(hybrid/engine/runner/cache_store.py): the longest held prefix within a limit, copies that
leave the held cache as it was, and least-recently-used eviction by entries and tokens."""

from __future__ import annotations

import torch

from hybrid.engine.runner.cache_store import CacheStore


def test_the_longest_whole_prefix_within_the_limit_as_a_copy() -> None:
    store = CacheStore(max_entries=8, max_tokens=100)
    store.put([1, 2, 3], {"k": torch.zeros(3)})
    store.put([1, 2, 3, 4, 5], {"k": torch.ones(5)})
    store.put([9, 9], {"k": torch.ones(2)})
    cache, n = store.take([1, 2, 3, 4, 5, 6], limit=5)
    assert n == 5 and cache["k"].tolist() == [1.0] * 5
    cache["k"].add_(1)  # the caller grows its copy; the held one stays
    assert store.take([1, 2, 3, 4, 5, 6], limit=5)[0]["k"].tolist() == [1.0] * 5
    assert store.take([1, 2, 3, 4, 5], limit=4)[1] == 3  # the last token left to compute
    assert store.take([1, 2, 7], limit=10) is None  # [1, 2, 3] is not a prefix of it
    assert store.take([2, 1, 2, 3], limit=10) is None  # only prefixes, not any substring


def test_least_recently_used_go_first_by_entries_and_by_tokens() -> None:
    store = CacheStore(max_entries=2, max_tokens=10)
    store.put([1], "a")
    store.put([2], "b")
    assert store.take([1, 0], limit=1) == ("a", 1)  # [1] used last: [2] goes next
    store.put([3], "c")
    assert len(store) == 2 and store.take([2, 0], limit=1) is None
    store.put([4] * 9, "d")  # 9 + 1 + 1 tokens > 10: the oldest go until it fits
    assert store.tokens <= 10 and store.take([4] * 10, limit=9) == ("d", 9)
    store.put(list(range(11)), "e")  # longer than the store holds: not kept
    assert store.take(list(range(12)), limit=11) != ("e", 11)
    assert all(len(k) <= 10 for k in store._entries)


def test_the_same_tokens_keep_the_cache_held() -> None:
    store = CacheStore(max_entries=4, max_tokens=10)
    store.put([1, 2], "first")
    store.put([1, 2], "second")
    assert store.take([1, 2, 3], limit=2) == ("first", 2) and store.tokens == 2
