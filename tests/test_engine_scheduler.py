"""The scheduler alone: chunk budgets, admission by KV pages, FCFS, clamping and rejection."""

from __future__ import annotations

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.scheduling.kv_pages import PageAllocator
from hybrid.engine.scheduling.request import RequestStatus
from hybrid.engine.scheduling.scheduler import Scheduler
from hybrid.errors import HybridError, RequestRejected
from tests.engine_fakes import make


def shape(batch) -> list[tuple[str, int, int, bool]]:
    return [(c.request.request_id, c.start, len(c.token_ids), c.samples) for c in batch.chunks]


def test_long_prompt_is_chunked_while_decodes_go_on() -> None:
    s = Scheduler(EngineConfig(chunk_size=32, cache_lens=1024, page_size=16), 4096)
    short, _ = make([1, 2, 3], 10)
    s.add(short)
    b = s.schedule()
    s.complete(b.chunks)
    short.append(99)  # the engine samples after a chunk that reaches the newest token
    long, _ = make(list(range(100, 200)), 5)
    s.add(long)
    seen = []
    for _ in range(4):
        b = s.schedule()
        seen.append(shape(b))
        s.complete(b.chunks)
        short.append(99)
    assert [step[0] for step in seen] == [("r1", 3 + i, 1, True) for i in range(4)]
    assert [step[1] for step in seen] == [("r100", 0, 32, False), ("r100", 32, 32, False),
                                         ("r100", 64, 32, False), ("r100", 96, 4, True)]
    assert seen[0][1][0] == "r100" and long.token_ids(96, 100) == [196, 197, 198, 199]


def test_prompt_chunks_shrink_to_decode_chunk_size_beside_decodes() -> None:
    """Alone, a prompt takes chunk_size tokens a step; beside a decoding request at most
    decode_chunk_size (its inter-token latency stays near a decode step's)."""
    s = Scheduler(EngineConfig(chunk_size=64, decode_chunk_size=24, cache_lens=1024,
                               page_size=16), 4096)
    first, _ = make(list(range(100, 200)), 5)
    s.add(first)
    b = s.schedule()
    assert shape(b) == [("r100", 0, 64, False)]  # nothing decodes: the whole budget
    s.complete(b.chunks)
    b = s.schedule()
    s.complete(b.chunks)
    first.append(7)
    second, _ = make(list(range(300, 400)), 5)
    s.add(second)
    b = s.schedule()
    assert shape(b) == [("r100", 100, 1, True), ("r300", 0, 24, False)]
    with pytest.raises(HybridError, match="decode_chunk_size must be at least 1"):
        EngineConfig(decode_chunk_size=0)


def test_admission_waits_for_pages_and_frees_them_at_finish() -> None:
    s = Scheduler(EngineConfig(cache_lens=64, page_size=16), 4096)  # 4 pages
    reqs = [make([10 * i + 1] * 10, 20)[0] for i in range(3)]  # 30 tokens = 2 pages each
    for r in reqs:
        s.add(r)
    b = s.schedule()
    assert [c.request for c in b.chunks] == reqs[:2] and s.pages.num_free == 0
    assert reqs[2].status is RequestStatus.WAITING
    s.complete(b.chunks)
    s.finish(reqs[0], RequestStatus.FINISHED_STOPPED)
    assert s.pages.num_free == 2 and reqs[0].page_ids == []
    b = s.schedule()
    assert reqs[2] in [c.request for c in b.chunks] and s.pages.num_free == 0


def test_fcfs_head_is_not_overtaken() -> None:
    s = Scheduler(EngineConfig(cache_lens=64, page_size=16), 4096)
    small, _ = make([1] * 4, 12)  # 1 page
    big, _ = make([2] * 40, 12)  # 4 pages: must wait for `small`
    later, _ = make([3] * 4, 4)  # would fit, but arrived after `big`
    for r in (small, big, later):
        s.add(r)
    s.complete(s.schedule().chunks)
    assert (big.status, later.status) == (RequestStatus.WAITING, RequestStatus.WAITING)
    s.finish(small, RequestStatus.FINISHED_LENGTH)
    s.schedule()
    assert big.status is RequestStatus.RUNNING and later.status is RequestStatus.WAITING


def test_max_batch_size_bounds_running_requests() -> None:
    s = Scheduler(EngineConfig(max_batch_size=3, cache_lens=4096, page_size=16), 4096)
    for i in range(5):
        s.add(make([i + 1], 4)[0])
    assert len(s.schedule().chunks) == 3 and len(s.waiting) == 2


def test_never_fitting_prompt_is_rejected_and_max_tokens_is_clamped() -> None:
    s = Scheduler(EngineConfig(cache_lens=64, page_size=16), 4096)
    with pytest.raises(RequestRejected, match="at most 64 tokens.*--cache-lens 64"):
        s.add(make([1] * 64, 1)[0])
    r, _ = make([1] * 60, 500)
    s.add(r)
    assert r.max_tokens == 4  # 60 + 4 = the whole cache
    ctx = Scheduler(EngineConfig(cache_lens=4096, page_size=16), context_length=100)
    with pytest.raises(RequestRejected, match="at most 100 tokens"):
        ctx.add(make([1] * 100, 1)[0])


def test_cancelled_requests_free_pages_whether_queued_or_running() -> None:
    s = Scheduler(EngineConfig(max_batch_size=1, cache_lens=256, page_size=16), 4096)
    (a, _), (b, _) = make([1] * 5, 5), make([2] * 5, 5)
    s.add(a)
    s.add(b)
    s.complete(s.schedule().chunks)
    a.cancel()
    b.cancel()
    batch = s.schedule()
    assert set(batch.cancelled) == {a, b} and batch.chunks == []
    assert s.pages.num_used == 0 and not s.has_work


def test_page_allocator_never_double_books() -> None:
    pages = PageAllocator(8, 4)
    a, b = pages.allocate(9), pages.allocate(12)  # 3 pages each
    assert a is not None and b is not None and not set(a) & set(b)
    assert pages.allocate(9) is None and pages.num_free == 2  # nothing taken on failure
    pages.free(a)
    c = pages.allocate(20)
    assert c is not None and len(c) == 5 and not set(c) & set(b)


def test_engine_config_validates() -> None:
    with pytest.raises(HybridError, match="max_batch_size"):
        EngineConfig(max_batch_size=0)
    with pytest.raises(HybridError, match="cache_lens"):
        EngineConfig(cache_lens=8, page_size=16)
    with pytest.raises(HybridError, match="chunk_size"):
        EngineConfig(chunk_size=0)
