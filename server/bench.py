"""`hybrid bench`: load a running server with concurrent streams and report latency and speed.

Each request is a /v1/completions stream of `prompt_len` token ids with `ignore_eos`, so it
generates exactly `gen_len` tokens, and `logprobs: 0`, so every token arrives as its own chunk.
Reported: time to first token (TTFT), inter-token latency (ITL), per-stream decode tokens/s and
the aggregate generated tokens/s over the whole run's wall time.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from hybrid.errors import HybridError


@dataclass(frozen=True)
class BenchOptions:
    url: str = "http://127.0.0.1:8000"
    concurrency: int = 1
    prompt_len: int = 32
    gen_len: int = 64
    num_requests: int = 8
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("concurrency", "prompt_len", "gen_len", "num_requests"):
            if getattr(self, name) < 1:
                raise HybridError(f"--{name.replace('_', '-')} must be at least 1")


@dataclass(frozen=True)
class StreamTiming:
    ttft_s: float
    itl_s: list[float]  # gaps between consecutive tokens
    num_tokens: int
    total_s: float


@dataclass(frozen=True)
class BenchResult:
    concurrency: int
    num_requests: int
    wall_s: float
    total_tokens: int
    aggregate_tokens_per_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    itl_mean_s: float
    itl_p50_s: float
    stream_tokens_per_s_mean: float


def _one(client, opts: BenchOptions, model: str, index: int, salt: int) -> StreamTiming:
    # `salt` (random per run) makes every run's prompts new to the server's prefix cache, so
    # TTFT measures prefill, not an earlier run's cached pages
    prompt = [1 + (salt + index * 7919 + j * 104729) % 1000 for j in range(opts.prompt_len)]
    body = {"model": model, "prompt": prompt, "max_tokens": opts.gen_len, "temperature": 0,
            "stream": True, "ignore_eos": True, "logprobs": 0}
    start = time.perf_counter()
    stamps = []
    with client.stream("POST", f"{opts.url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise HybridError(f"the server answered {r.status_code}: {r.text[:200]}")
        for line in r.iter_lines():
            if line.startswith("data: {") and '"error"' not in line[:20]:
                stamps.append(time.perf_counter())
    if not stamps:
        raise HybridError("the server streamed no tokens")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return StreamTiming(stamps[0] - start, gaps, len(stamps), stamps[-1] - start)


def run_bench(opts: BenchOptions, progress: bool = True) -> BenchResult:
    import httpx

    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    with httpx.Client(headers=headers, timeout=600) as client:
        try:
            models = client.get(f"{opts.url}/v1/models")
        except httpx.HTTPError as e:
            raise HybridError(f"cannot reach {opts.url}: {e}") from None
        if models.status_code != 200:
            raise HybridError(f"{opts.url}/v1/models answered {models.status_code}")
        model = opts.model or models.json()["data"][0]["id"]
        from tqdm import tqdm

        bar = tqdm(total=opts.num_requests, desc=f"c={opts.concurrency}", unit="req",
                   file=sys.stderr, disable=not progress, leave=False)
        lock = threading.Lock()
        salt = random.randrange(1000)

        def task(i: int) -> StreamTiming:
            t = _one(client, opts, model, i, salt)
            with lock:
                bar.update()
            return t

        start = time.perf_counter()
        with ThreadPoolExecutor(opts.concurrency) as pool:
            timings = list(pool.map(task, range(opts.num_requests)))
        wall = time.perf_counter() - start
        bar.close()
    itl = [g for t in timings for g in t.itl_s] or [0.0]
    ttft = [t.ttft_s for t in timings]
    per_stream = [(t.num_tokens - 1) / (t.total_s - t.ttft_s) for t in timings
                  if t.num_tokens > 1 and t.total_s > t.ttft_s]
    tokens = sum(t.num_tokens for t in timings)
    return BenchResult(opts.concurrency, opts.num_requests, wall, tokens, tokens / wall,
                       statistics.fmean(ttft), statistics.median(ttft), statistics.fmean(itl),
                       statistics.median(itl), statistics.fmean(per_stream or [0.0]))


def render(result: BenchResult) -> str:
    rows = [("concurrency", f"{result.concurrency}"), ("requests", f"{result.num_requests}"),
            ("wall time", f"{result.wall_s:.2f} s"), ("tokens generated", f"{result.total_tokens}"),
            ("aggregate tokens/s", f"{result.aggregate_tokens_per_s:.1f}"),
            ("per-stream tokens/s (mean)", f"{result.stream_tokens_per_s_mean:.1f}"),
            ("TTFT mean / p50", f"{result.ttft_mean_s * 1e3:.0f} / {result.ttft_p50_s * 1e3:.0f} ms"),
            ("ITL mean / p50", f"{result.itl_mean_s * 1e3:.1f} / {result.itl_p50_s * 1e3:.1f} ms")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def to_json(result: BenchResult) -> str:
    return json.dumps(asdict(result))
