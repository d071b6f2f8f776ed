"""Prefix caching: the radix tree's bookkeeping alone, the scheduler's admission with it, and
whole generations equal with and without it (tokens and logprobs) across interleaved requests,
cancellations and evictions."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.kv_pages import PrefixCache
from hybrid.engine.scheduling.scheduler import Scheduler
from tests.engine_fakes import make

P = 4  # page size of the unit tests


def test_match_publish_release_and_refcounts() -> None:
    c = PrefixCache(P)
    tokens = list(range(10))  # pages [0..3], [4..7], a partial one
    c.publish(1, tokens, [7, 8, 9], num_computed=10)
    assert c.num_pages == 2 and c.num_idle == 0  # the publisher holds both full pages
    assert c.match(tokens + [99], limit=10) == [7, 8]
    assert c.match([0, 1, 2, 3, 5, 5, 5, 5], limit=8) == [7]  # diverges in page 2
    assert c.match(tokens, limit=7) == [7]  # whole pages within the limit only
    assert c.release(1, [7, 8, 9]) == [9]  # the partial page was never published
    assert c.num_idle == 0  # the matches still hold 7 (3 times) and 8
    c.release(2, [7, 8])
    c.release(3, [7])
    c.release(4, [7])
    assert c.num_idle == 2


def test_a_duplicate_page_stays_private_and_later_pages_still_join() -> None:
    c = PrefixCache(P)
    tokens = list(range(12))
    c.publish(1, tokens, [0, 1, 2], num_computed=12)
    c.publish(2, tokens, [5, 6, 7], num_computed=8)  # computed the same prefix meanwhile
    assert c.num_pages == 3
    assert c.release(2, [5, 6, 7]) == [5, 6, 7]  # none of its pages entered the tree


def test_eviction_takes_idle_leaves_least_recently_used_first() -> None:
    c = PrefixCache(P)
    a, b = list(range(8)), [0, 1, 2, 3, 50, 51, 52, 53]
    c.publish(1, a, [1, 2], num_computed=8)
    assert c.match(b, limit=7) == [1]  # request 2 is admitted with page 1
    c.publish(2, b, [1, 3], num_computed=8)  # and publishes its own page 3 under it
    c.release(1, [1, 2])
    assert c.evict(5) == [2]  # request 2 holds 1 and 3; 2 is an idle leaf
    c.release(2, [1, 3])
    assert c.evict(1) == [3]  # 1 is no leaf while 3 hangs under it
    assert c.evict(5) == [1]
    assert c.num_pages == 0


def test_scheduler_admits_with_the_cached_prefix() -> None:
    s = Scheduler(EngineConfig(chunk_size=64, cache_lens=64, page_size=P), 4096)
    first, _ = make(list(range(100, 110)), 2)
    s.add(first)
    b = s.schedule()
    s.complete(b.chunks)
    s.finish(first, first.status.__class__("stop"))
    assert s.num_pages_held == 0 and s.cache.num_idle == 2
    second, _ = make(list(range(100, 110)) + [7, 8, 9], 2)
    s.add(second)
    b = s.schedule()
    (chunk,) = b.chunks
    assert second.num_cached_tokens == 8 and chunk.start == 8 and len(chunk.token_ids) == 5
    assert second.page_ids[:2] == first_pages(s, 2)


def first_pages(s: Scheduler, n: int) -> list[int]:
    return sorted(s.cache._nodes)[:n]  # the two published pages


def test_a_full_pool_evicts_idle_pages_to_admit() -> None:
    s = Scheduler(EngineConfig(chunk_size=64, cache_lens=32, page_size=P), 4096)  # 8 pages
    r, _ = make(list(range(24)), 4)  # 28 tokens: 7 pages
    s.add(r)
    s.complete(s.schedule().chunks)
    s.finish(r, r.status.__class__("stop"))
    assert s.cache.num_idle == 6 and s.pages.num_free == 2
    other, _ = make(list(range(500, 520)), 4)  # nothing in common: needs 6 pages
    s.add(other)
    assert s.schedule().chunks and s.num_pages_held == 6


PROMPT = [0, *range(1000, 1150)]  # 151 tokens: 9 full pages of 16


@pytest.fixture(scope="module")
def llms(models):
    path = str(models.path("tiny-v3", "q4_k_m"))
    mk = lambda cache, lens=2048: LLM(path, "cpu", engine_config=EngineConfig(
        cache_lens=lens, page_size=16, chunk_size=64, max_batch_size=4, prefix_cache=cache))
    return {"on": mk(True), "off": mk(False), "small": mk(True, 160)}


def _run(llm: LLM, prompts: list[list[int]], max_tokens: int = 6):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


def test_turns_of_a_chat_reuse_the_history(llms) -> None:
    """Each turn resends the history with the model's answer and a new message: with the
    cache only the new tokens are prefilled, and tokens and logprobs equal a run without it."""
    on, off = llms["on"], llms["off"]
    history = list(PROMPT)
    for turn in range(3):
        got, ref = _run(on, [history])[0], _run(off, [history])[0]
        assert got.token_ids == ref.token_ids
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-4)
        history = history + got.token_ids + [2000 + 10 * turn + k for k in range(9)]
    assert on.engine.scheduler.num_cached_tokens >= 2 * 144
    assert on.engine.scheduler.num_pages_held == 0


def test_interleaved_requests_share_and_equal_the_uncached_run(llms) -> None:
    on, off = llms["on"], llms["off"]
    _run(on, [PROMPT])  # publishes the prefix
    prompts = [PROMPT + [7, 8], PROMPT[:40] + [9] * 30, PROMPT + [7, 8, 9, 10], [5, 6, 7]]
    got, ref = _run(on, prompts), _run(off, prompts)
    for g, r in zip(got, ref):
        assert g.token_ids == r.token_ids
        np.testing.assert_allclose(g.logprobs, r.logprobs, atol=1e-4)
    assert on.engine.scheduler.num_pages_held == 0


def test_cancelled_requests_and_evictions_keep_outputs_equal(llms) -> None:
    small, off = llms["small"], llms["off"]  # 10 pages: admissions evict
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    doomed = small._submit(PROMPT[:100], params, lambda e: None)
    small.worker.step()
    doomed.cancel()
    while small.engine.has_work:
        small.worker.step()
    prompts = [PROMPT[:100] + [3], list(range(3000, 3120)), PROMPT[:100] + [4]]
    for p in prompts:  # one at a time: each needs most of the pool
        assert _run(small, [p], 4)[0].token_ids == _run(off, [p], 4)[0].token_ids
    sched = small.engine.scheduler
    assert sched.num_pages_held == 0 and sched.pages.num_free + sched.cache.num_pages == 10
    assert sched.cache.num_evicted > 0 and sched.num_cached_tokens > 0
