"""The served engine under load: 16 concurrent greedy streams equal each request alone and
share forwards; a small KV cache queues 32 requests and never drops one; a prompt that can never
fit is a 400 naming the limit; a disconnect frees its pages at once (read from /metrics)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from server.config import ServerConfig
from tests.test_server_support import API_KEY, LiveServer

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def start(models, **engine) -> LiveServer:
    from server.serve import build_state

    config = ServerConfig.from_flat({
        "gguf_path": str(models.path("tiny-v3", "q4_k_m")), "optimize_rules": "cpu.yaml",
        "max_new_tokens": 200, "api_key": API_KEY, **engine})
    return LiveServer(build_state(config))


@pytest.fixture(scope="module")
def busy(models) -> Iterator[LiveServer]:
    server = start(models, max_batch_size=16, chunk_size=32, cache_lens=2048, page_size=16)
    yield server
    server.close()


@pytest.fixture(scope="module")
def small(models) -> Iterator[LiveServer]:
    server = start(models, max_batch_size=16, cache_lens=64, page_size=16)
    yield server
    server.close()


def client_for(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def metric(server: LiveServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=10).text
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def run_concurrently(fn, n: int) -> list:
    results: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - surfaced below, with the request's index
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return results


def test_sixteen_concurrent_greedy_streams_equal_each_alone(busy: LiveServer) -> None:
    client, model = client_for(busy), busy.state.model.name
    cases = [([(11 * i + j) % 400 + 3 for j in range(2 + 5 * i)], 6 + (i * 5) % 11)
             for i in range(16)]

    def ask(prompt, n, stream):
        return client.completions.create(model=model, prompt=prompt, max_tokens=n,
                                         temperature=0, logprobs=0, stream=stream)

    alone = [ask(p, n, False).choices[0] for p, n in cases]  # one at a time
    assert busy.health()["max_batch_requests"] == 1

    def streamed(i: int) -> tuple[list[str], list[float]]:
        chunks = list(ask(*cases[i], True))
        return ([t for c in chunks for t in c.choices[0].logprobs.tokens],
                [x for c in chunks for x in c.choices[0].logprobs.token_logprobs])

    together = run_concurrently(streamed, 16)
    for ref, (tokens, logprobs) in zip(alone, together):
        assert tokens == ref.logprobs.tokens
        assert logprobs == pytest.approx(ref.logprobs.token_logprobs, abs=1e-3)
    # The decodes of different requests ran in the same forwards.
    assert metric(busy, "hybrid_max_batch_requests") > 1
    assert max(d for _, d, _ in busy.state.worker.step_log) > 1
    assert metric(busy, "hybrid_kv_pages_used") == 0


def test_disconnect_mid_stream_frees_all_its_pages(busy: LiveServer) -> None:
    busy.wait_idle()
    body = {"model": busy.state.model.name, "prompt": [3, 4, 5], "max_tokens": 200,
            "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as http, \
            http.stream("POST", f"{busy.url}/v1/completions", json=body, headers=AUTH) as r:
        lines = r.iter_lines()
        while '"text":""' in (line := next(lines)).replace(" ", "") or not line:
            pass  # until the first generated token: the request holds its pages now
        assert metric(busy, "hybrid_kv_pages_used") == 13  # 203 tokens in pages of 16
    deadline = time.monotonic() + 20
    while metric(busy, "hybrid_kv_pages_used") != 0:
        assert time.monotonic() < deadline, "the pages were not freed"
        time.sleep(0.02)
    assert busy.wait_idle()["num_cancelled"] >= 1


def test_small_cache_completes_32_concurrent_requests(small: LiveServer) -> None:
    client, model = client_for(small), small.state.model.name
    before = small.wait_idle()["num_finished"]

    def ask(i: int) -> tuple[int, str]:
        r = client.completions.create(model=model, prompt=[i + 2, i + 3, i + 4], max_tokens=13,
                                      temperature=0)
        return r.usage.completion_tokens, r.choices[0].finish_reason

    assert run_concurrently(ask, 32) == [(13, "length")] * 32
    health = small.wait_idle()
    assert health["num_finished"] - before == 32 and health["max_running"] <= 4  # 4 pages of 16
    assert health["kv_pages_used"] == 0


def test_prompt_that_can_never_fit_is_a_400_naming_the_limit(small: LiveServer) -> None:
    body = {"model": small.state.model.name, "prompt": list(range(2, 80)), "max_tokens": 1}
    r = httpx.post(f"{small.url}/v1/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400
    error = r.json()["error"]
    assert "at most 64 tokens" in error["message"] and "--cache-lens 64" in error["message"]
    assert error["code"] == "context_length_exceeded"
    # A max_tokens beyond the cache is clamped: the answer ends with "length" at the cache's end
    # (an end-of-text token the random model might pick is not what this checks).
    body = {"model": small.state.model.name, "prompt": list(range(2, 62)), "max_tokens": 100,
            "ignore_eos": True}
    r = httpx.post(f"{small.url}/v1/completions", json=body, headers=AUTH, timeout=60).json()
    assert r["usage"]["completion_tokens"] == 4 and r["choices"][0]["finish_reason"] == "length"


def test_streams_ending_at_different_steps_under_launch_ahead(models) -> None:
    """`--overlap-decode on` (the GPU's default with whole-step graphs; eager steps here): 12
    concurrent greedy streams of different lengths, some stopping while the others' next step
    is already scheduled, give each request its tokens alone and free every page."""
    server = start(models, max_batch_size=16, chunk_size=32, cache_lens=2048, page_size=16,
                   overlap_decode="on")
    try:
        client, model = client_for(server), server.state.model.name
        assert server.state.worker.engine.overlap
        cases = [([(13 * i + j) % 400 + 3 for j in range(3 + 4 * i)], 4 + (i * 7) % 13)
                 for i in range(12)]

        def ask(prompt, n, stream):
            return client.completions.create(model=model, prompt=prompt, max_tokens=n,
                                             temperature=0, logprobs=0, stream=stream)

        alone = [ask(p, n, False).choices[0].logprobs.tokens for p, n in cases]
        together = run_concurrently(
            lambda i: [t for c in ask(*cases[i], True) for t in c.choices[0].logprobs.tokens],
            12)
        assert together == alone
        assert len({len(t) for t in alone}) > 3  # they end at different steps
        assert max(d for _, d, _ in server.state.worker.step_log) > 1
        assert server.wait_idle()["kv_pages_used"] == 0
    finally:
        server.close()
