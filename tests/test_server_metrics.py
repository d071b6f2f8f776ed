"""GET /metrics: the exposition format, histograms and the token-rate window (no model), then
the live endpoint against /health, and docs/metrics.md against the endpoint."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from server.metrics import ITL, TOKENS_PER_S, TTFT, ServerMetrics
from tests.test_server_support import API_KEY, live_server  # noqa: F401

DOC = Path(__file__).parent.parent / "docs" / "metrics.md"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SAMPLE = re.compile(r'^([a-z_]+)(\{le="([^"]+)"\})? (\S+)$')


def parse(text: str) -> tuple[dict[str, str], dict[str, float]]:
    """({metric: type}, {series: value}); every line must be a comment or a sample."""
    types, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif not line.startswith("# HELP "):
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            key = m.group(1) + (f"[{m.group(3)}]" if m.group(2) else "")
            values[key] = float(m.group(4))
    return types, values


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


STATS = SimpleNamespace(num_waiting=1, num_running=2, kv_pages_used=3, kv_pages_total=512,
                        kv_page_size=64, max_batch_requests=2, num_generated_tokens=7,
                        num_prompt_tokens=9, num_submitted=4, num_finished=1, num_cancelled=1,
                        num_failed=0, num_expert_layers_streamed=5, num_expert_layers_cpu=6,
                        kv_pages_cached=8, num_cached_prompt_tokens=10)


def test_histograms_and_token_rate_with_a_fake_clock() -> None:
    clock = FakeClock()
    metrics = ServerMetrics(clock)
    stream = metrics.stream(num_choices=2)
    for index, step in ((0, 0.3), (1, 0.0), (0, 0.02), (0, 0.2)):
        clock.now += step
        stream.token(index)
    _, v = parse(metrics.render(STATS))
    assert v[f"{TTFT}_count"] == 2 and v[f"{TTFT}_sum"] == pytest.approx(0.6)
    assert v[f"{TTFT}_bucket[0.25]"] == 0 and v[f"{TTFT}_bucket[0.5]"] == 2
    assert v[f"{TTFT}_bucket[+Inf]"] == 2
    assert v[f"{ITL}_count"] == 2 and v[f"{ITL}_sum"] == pytest.approx(0.22)
    assert v[f"{ITL}_bucket[0.025]"] == 1 and v[f"{ITL}_bucket[0.25]"] == 2
    assert v[TOKENS_PER_S] == pytest.approx(4 / 10)
    clock.now += 9.9  # the first three tokens fall out of the 10 s window
    assert metrics.tokens_per_second() == pytest.approx(1 / 10)
    clock.now += 1
    assert metrics.tokens_per_second() == 0
    assert v["hybrid_requests_waiting"] == 1 and v["hybrid_kv_pages_total"] == 512
    assert v["hybrid_generation_tokens_total"] == 7
    assert v["hybrid_expert_layers_streamed_total"] == 5


def test_docs_list_every_metric_the_endpoint_serves() -> None:
    documented = dict(re.findall(r"^\| `(hybrid_\w+)` \| (\w+) \|", DOC.read_text(), re.MULTILINE))
    types, _ = parse(ServerMetrics().render(STATS))
    assert documented == types
    assert len(types) == 19


def test_live_metrics_follow_requests(live_server) -> None:  # noqa: F811
    r = httpx.get(f"{live_server.url}/metrics", headers=AUTH, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    _, before = parse(r.text)
    body = {"model": live_server.state.model.name, "prompt": [0, 9], "max_tokens": 4, "n": 2,
            "temperature": 0, "ignore_eos": True}
    done = httpx.post(f"{live_server.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert done.status_code == 200
    health = live_server.wait_idle()
    _, after = parse(httpx.get(f"{live_server.url}/metrics", headers=AUTH, timeout=10).text)
    assert after[f"{TTFT}_count"] - before[f"{TTFT}_count"] == 2  # one per choice
    assert after[f"{ITL}_count"] - before[f"{ITL}_count"] == 2 * 3
    assert after[TOKENS_PER_S] > 0
    for name, field in (("hybrid_generation_tokens_total", "num_generated_tokens"),
                        ("hybrid_prompt_tokens_total", "num_prompt_tokens"),
                        ("hybrid_requests_finished_total", "num_finished"),
                        ("hybrid_kv_pages_total", "kv_pages_total"),
                        ("hybrid_kv_page_size_tokens", "kv_page_size"),
                        ("hybrid_requests_running", "num_running")):
        assert after[name] == health[field], name
    assert after["hybrid_kv_pages_used"] == 0  # no live request holds pages when idle
    assert after["hybrid_requests_finished_total"] - before["hybrid_requests_finished_total"] == 2
