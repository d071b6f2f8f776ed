"""GET /metrics: the engine's queues and counters, token speed and latency histograms, in the
Prometheus text exposition format 0.0.4 (written here; no client library needed).

Engine values are read from `EngineWorker.stats()` at scrape time. Time to first token and
inter-token latency are observed by `server/generation.py` as each token reaches its HTTP
handler, so they include queueing and what the client actually waits for. Every metric is
documented in docs/metrics.md (a test checks both list the same names).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable

from fastapi import APIRouter
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TOKENS_PER_S_WINDOW_S = 10.0
TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# (name, EngineStats field, help) of the values read from the engine at scrape time.
ENGINE_GAUGES = (
    ("hybrid_requests_waiting", "num_waiting", "Requests queued, not yet admitted."),
    ("hybrid_requests_running", "num_running", "Requests admitted and generating."),
    ("hybrid_kv_pages_used", "kv_pages_used", "KV cache pages held by live requests."),
    ("hybrid_kv_pages_total", "kv_pages_total", "KV cache pages in all."),
    ("hybrid_kv_page_size_tokens", "kv_page_size", "Tokens per KV cache page."),
    ("hybrid_kv_pages_cached", "kv_pages_cached",
     "KV cache pages in the prefix cache, held by requests or idle (evictable)."),
    ("hybrid_max_batch_requests", "max_batch_requests",
     "The most requests that shared one forward so far."),
)
ENGINE_COUNTERS = (
    ("hybrid_generation_tokens_total", "num_generated_tokens", "Tokens generated."),
    ("hybrid_prompt_tokens_total", "num_prompt_tokens", "Prompt tokens prefilled."),
    ("hybrid_prompt_tokens_cached_total", "num_cached_prompt_tokens",
     "Prompt tokens whose KV the prefix cache held at admission (not prefilled again)."),
    ("hybrid_requests_submitted_total", "num_submitted", "Requests submitted to the engine."),
    ("hybrid_requests_finished_total", "num_finished", "Requests ended by a stop or length."),
    ("hybrid_requests_cancelled_total", "num_cancelled",
     "Requests cancelled (client gone), queued or running."),
    ("hybrid_requests_failed_total", "num_failed", "Requests ended by an engine error."),
    ("hybrid_expert_layers_streamed_total", "num_expert_layers_streamed",
     "MoE layer-steps whose routed experts were streamed to the GPU (long prompts)."),
    ("hybrid_expert_layers_cpu_total", "num_expert_layers_cpu",
     "MoE layer-steps whose routed experts ran on the CPU."),
)
TOKENS_PER_S = "hybrid_generation_tokens_per_second"
TTFT = "hybrid_time_to_first_token_seconds"
ITL = "hybrid_inter_token_latency_seconds"


def _num(value: float) -> str:
    if isinstance(value, float):
        return "+Inf" if value == float("inf") else repr(value)
    return str(value)


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus histograms expose them."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, the last one +Inf; not cumulative
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            total += count
            out.append(f'{name}_bucket{{le="{_num(bound)}"}} {total}')
        return [*out, f"{name}_sum {_num(self.sum)}", f"{name}_count {total}"]


class ServerMetrics:
    """What the HTTP layer observes; one per app (`app.state.metrics`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self._token_times: deque[float] = deque()  # within the last window
        # NOTE: handlers and scrapes share one event loop today; the lock keeps this correct if
        # an observation ever comes from another thread.
        self._lock = threading.Lock()

    def stream(self, num_choices: int) -> StreamObserver:
        """An observer for one HTTP request's choices, started now (at submission)."""
        return StreamObserver(self, num_choices)

    def observe_token(self, now: float, ttft: float | None, itl: float | None) -> None:
        with self._lock:
            if ttft is not None:
                self.ttft.observe(ttft)
            if itl is not None:
                self.itl.observe(itl)
            self._token_times.append(now)
            self._trim(now)

    def tokens_per_second(self) -> float:
        with self._lock:
            self._trim(self.clock())
            return len(self._token_times) / TOKENS_PER_S_WINDOW_S

    def _trim(self, now: float) -> None:
        while self._token_times and self._token_times[0] <= now - TOKENS_PER_S_WINDOW_S:
            self._token_times.popleft()

    def render(self, stats: object) -> str:
        """The exposition text; `stats`: an `EngineStats` snapshot."""
        lines: list[str] = []
        for kind, table in (("gauge", ENGINE_GAUGES), ("counter", ENGINE_COUNTERS)):
            for name, field, help_text in table:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                          f"{name} {_num(getattr(stats, field))}"]
        rate_help = (f"Tokens generated per second over the last {TOKENS_PER_S_WINDOW_S:g} s "
                     "(sent to clients).")
        lines += [f"# HELP {TOKENS_PER_S} {rate_help}", f"# TYPE {TOKENS_PER_S} gauge",
                  f"{TOKENS_PER_S} {_num(self.tokens_per_second())}"]
        with self._lock:
            for name, hist, help_text in (
                    (TTFT, self.ttft, "Seconds from submission to a choice's first token."),
                    (ITL, self.itl, "Seconds between consecutive tokens of a choice.")):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram",
                          *hist.lines(name)]
        return "\n".join(lines) + "\n"


class StreamObserver:
    """Times one HTTP request: first token from submission, then gaps, per choice."""

    def __init__(self, metrics: ServerMetrics, num_choices: int) -> None:
        self.metrics = metrics
        self.start = metrics.clock()
        self.last: list[float | None] = [None] * num_choices

    def token(self, index: int) -> None:
        now = self.metrics.clock()
        last = self.last[index]
        self.last[index] = now
        if last is None:
            self.metrics.observe_token(now, ttft=now - self.start, itl=None)
        else:
            self.metrics.observe_token(now, ttft=None, itl=now - last)


def observer_for(http_request: HTTPRequest, num_choices: int) -> StreamObserver | None:
    """The app's observer for this request; None for an app without metrics."""
    app = http_request.scope.get("app")
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    return metrics.stream(num_choices) if isinstance(metrics, ServerMetrics) else None


router = APIRouter()


@router.get("/metrics")
async def metrics(http_request: HTTPRequest) -> Response:
    app = http_request.app
    body = app.state.metrics.render(app.state.hybrid.worker.stats())
    return Response(body, media_type=CONTENT_TYPE)
