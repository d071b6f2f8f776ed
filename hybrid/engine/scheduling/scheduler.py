"""FCFS continuous batching with chunked prefill over a paged KV cache (no torch, no threads).

Each step carries, in this order:
1. one decode token for every running request whose prompt is fully prefilled;
2. prompt chunks of running requests still prefilling, FCFS, then of newly admitted ones,
   at most `chunk_size` prompt tokens in all, or `decode_chunk_size` when the step decodes too
   (a long chunk beside decodes stretches their inter-token latency; a request whose chunk is
   still in flight, spread over steps by the model runner, gets none until it completes, and
   meanwhile a decoding step takes at most `in_flight_chunk_size` prompt tokens: they run on
   the CPU experts, inside the decode step);
with at most `max_batch_size` requests running. While any request's newest token is pending
(sampled on the device, not yet read back: the engine's overlapped decode), a step only
decodes: its decode's input is PENDING, at the position after the computed ones, and a request
whose pending token is its last (max_tokens) gets no step; prompts and admissions wait until
the engine has read the tokens back. A waiting request is admitted only when pages
for its prompt plus its max_tokens are free, so a running request never runs out of cache and
nothing is ever preempted; admission is strictly FCFS (a large request at the head waits for
pages rather than being overtaken forever). A request that could never fit is rejected at
`add()`. The caller (the engine worker) holds the lock around every call.

With the prefix cache (kv_pages.py, `EngineConfig.prefix_cache`) a request is admitted
holding the cached pages of its prompt's longest published prefix and starts computing after
them; its own full pages are published as their KV completes; pages no request holds are
evicted only when an admission needs them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from hybrid.engine.config import EngineConfig
from hybrid.engine.scheduling.kv_pages import PageAllocator, PrefixCache
from hybrid.engine.scheduling.request import Request, RequestStatus
from hybrid.errors import RequestRejected
from hybrid.model.activations import CPU_CHUNK

PENDING = -1  # a decode's input token that the step before sampled and has not read back


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens [start, start + len(token_ids)) of `request` to run through the model."""

    request: Request
    start: int
    token_ids: list[int]
    samples: bool  # the chunk reaches the request's newest token: sample the next one


@dataclass(frozen=True)
class ScheduledBatch:
    chunks: list[ScheduledChunk]  # decodes first, then prefill chunks
    cancelled: list[Request]  # dropped this step (already finished, pages freed)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def num_decodes(self) -> int:
        return sum(1 for c in self.chunks if not c.request.is_prefilling)


class Scheduler:
    def __init__(self, config: EngineConfig, context_length: int) -> None:
        self.config = config
        # prompt tokens a step takes (alone, beside decodes); the engine sets the runner's
        # choices where the config leaves them open (prefill_chunk.py)
        self.chunk_size = config.chunk_size or CPU_CHUNK
        self.decode_chunk_size = config.decode_chunk_size or self.chunk_size
        self.in_flight_chunk_size = self.decode_chunk_size
        self.pages = PageAllocator(config.num_pages, config.page_size)
        # The most tokens (prompt + outputs) one request may hold.
        self.max_request_tokens = min(config.num_pages * config.page_size, context_length)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.cache = PrefixCache(config.page_size) if config.prefix_cache else None
        self.num_cached_tokens = 0  # prompt tokens admitted with their KV already cached

    @property
    def num_pages_held(self) -> int:
        """Pages some live request holds (the rest are free or cached and idle)."""
        idle = self.cache.num_idle if self.cache is not None else 0
        return self.pages.num_used - idle

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: Request) -> None:
        """Queue `request`, clamping its max_tokens to what fits; RequestRejected if nothing does."""
        n, limit = request.num_prompt_tokens, self.max_request_tokens
        if n + 1 > limit:
            raise RequestRejected(
                f"the prompt has {n} tokens but this server holds at most {limit} tokens per "
                f"request (prompt plus output; the KV cache is --cache-lens "
                f"{self.config.num_pages * self.config.page_size} tokens): shorten the prompt or "
                f"raise --cache-lens")
        request.max_tokens = min(request.params.max_tokens, limit - n)
        self.waiting.append(request)

    def schedule(self) -> ScheduledBatch:
        cancelled = self._drop_cancelled()
        chunks = [self._decode(r) for r in self.running if not r.is_prefilling
                  and r.num_output_tokens + r.num_pending < r.max_tokens]
        if any(r.num_pending for r in self.running):
            return ScheduledBatch(chunks, cancelled)
        budget = self.chunk_size
        if chunks:
            budget = min(budget, self.decode_chunk_size)
            if any(r.in_flight for r in self.running):
                budget = min(budget, self.in_flight_chunk_size)
        for r in self.running:
            if budget and r.is_prefilling and not r.in_flight:
                budget -= self._prefill_chunk(r, budget, chunks)
        while (budget and self.waiting
               and len(self.running) < self.config.max_batch_size):
            head = self.waiting[0]
            if not self._admit(head):
                break  # FCFS: the head waits for pages; nobody overtakes it
            self.waiting.popleft()
            self.running.append(head)
            budget -= self._prefill_chunk(head, budget, chunks)
        return ScheduledBatch(chunks, cancelled)

    def _admit(self, r: Request) -> bool:
        """Give `r` its pages (cached prefix first) or, when too few are free even after
        evicting idle cached ones, leave everything as it was and say no."""
        cached = (self.cache.match(r.prompt_ids, r.num_prompt_tokens - 1)
                  if self.cache is not None else [])
        need = self.pages.pages_for(r.num_prompt_tokens + r.max_tokens) - len(cached)
        short = need - self.pages.num_free
        if short > 0 and self.cache is not None:
            self.pages.free(self.cache.evict(short))
        pages = self.pages.allocate(need * self.pages.page_size)
        if pages is None:
            if self.cache is not None:
                self.pages.free(self.cache.release(id(r), cached))  # frees nothing: all cached
            return False
        r.page_ids, r.status = cached + pages, RequestStatus.RUNNING
        r.num_computed_tokens = r.num_cached_tokens = len(cached) * self.pages.page_size
        self.num_cached_tokens += r.num_cached_tokens
        return True

    def complete(self, chunks: list[ScheduledChunk]) -> None:
        """These chunks ran (all of a step's, or a layered chunk some steps later): their
        tokens' KV is in the cache (and their full pages join the prefix cache). Calling it
        again for the same chunks changes nothing."""
        for c in chunks:
            r = c.request
            if r.is_finished:  # it ran after its end (overlapped decode): its pages are gone
                continue
            r.num_computed_tokens = c.start + len(c.token_ids)
            r.in_flight = False
            full = r.num_computed_tokens // self.pages.page_size
            if self.cache is not None and full > self.cache.num_published(id(r)):
                self.cache.publish(id(r), r.token_ids(0, r.num_computed_tokens), r.page_ids,
                                   r.num_computed_tokens)

    def defer(self, chunk: ScheduledChunk) -> None:
        """The chunk started but finishes in a later step (`complete` then): its request gets
        no new chunk meanwhile."""
        chunk.request.in_flight = True

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take a running request out and free its pages at once."""
        self.running.remove(request)
        self._release(request, status)

    @staticmethod
    def _decode(r: Request) -> ScheduledChunk:
        if r.num_pending:  # its input is the token in flight, at the position after the KV's
            return ScheduledChunk(r, r.num_computed_tokens, [PENDING], True)
        return ScheduledChunk(r, r.num_computed_tokens,
                              r.token_ids(r.num_computed_tokens, r.num_tokens), True)

    def _prefill_chunk(self, r: Request, budget: int, chunks: list[ScheduledChunk]) -> int:
        start = r.num_computed_tokens
        stop = min(r.num_prompt_tokens, start + budget)
        chunks.append(ScheduledChunk(r, start, r.token_ids(start, stop),
                                     stop == r.num_prompt_tokens))
        return stop - start

    def _drop_cancelled(self) -> list[Request]:
        cancelled = [r for r in (*self.running, *self.waiting) if r.is_cancel_requested]
        if cancelled:
            gone = set(map(id, cancelled))
            self.running = [r for r in self.running if id(r) not in gone]
            self.waiting = deque(r for r in self.waiting if id(r) not in gone)
            for r in cancelled:
                self._release(r, RequestStatus.FINISHED_CANCELLED)
        return cancelled

    def _release(self, request: Request, status: RequestStatus) -> None:
        own = request.page_ids
        if self.cache is not None:
            own = self.cache.release(id(request), request.page_ids)
        self.pages.free(own)
        request.page_ids, request.num_pending = [], 0
        request.finish(status)
