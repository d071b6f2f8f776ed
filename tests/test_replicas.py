"""`hybrid cluster` (server/replicas/): two replicas of the demo model behind one endpoint in a
local Ray instance: a chat's next turn reaches the replica that holds its prefix, more clients
at once than the replicas' batches hold are all answered, responses and errors are `hybrid
serve`'s (streaming included), /metrics labels every replica and /health sums them, and a
killed replica fails only its own requests, cleanly, while the endpoint keeps answering and
Ray Serve replaces it. Skipped without the `cluster` extra (ray[serve])."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from hybrid.engine.config import EngineConfig
from server.config import ServerConfig
from server.replicas import deployment

SYSTEM = ("You are a careful assistant who answers in one short sentence. " * 12).strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url():
    # a Ray instance of this process's own, whatever other tests run beside it
    ray.init(address="local", num_cpus=4, include_dashboard=False,
             namespace=deployment.APP_NAME, log_to_driver=False)
    config = ServerConfig(engine=EngineConfig(max_batch_size=8, cache_lens=4096),
                          port=_free_port())
    try:
        yield deployment.start(config, replicas=2, gpus=0, cpus=1)
    finally:
        deployment.stop()
        ray.shutdown()


def _chat(url: str, messages: list[dict], max_tokens: int = 4, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=120,
                      json={"model": "demo", "messages": messages, "max_tokens": max_tokens,
                            "temperature": 0, **extra})


def _running_replicas() -> int:
    from ray import serve

    app = serve.status().applications[deployment.APP_NAME]
    return app.deployments["engine"].replica_states.get("RUNNING", 0)


def _replica_names(url: str) -> set[str]:
    """The engine replicas /metrics reports (their Ray Serve ids), within 30 s."""
    deadline, names = time.monotonic() + 30, set()
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=30).text
        names = {line.split('replica="')[1].split('"')[0]
                 for line in text.splitlines() if 'replica="' in line}
        if len(names) == 2:
            break
        time.sleep(0.5)
    return names


def test_a_chats_next_turn_finds_its_prefix_cached(url):
    for n in range(4):  # with two replicas and no affinity, four would all hit by 1 in 16
        first = [{"role": "system", "content": f"{SYSTEM} Conversation {n}."},
                 {"role": "user", "content": f"Name a colour, please ({n})."}]
        r = _chat(url, first)
        assert r.status_code == 200, r.text
        reply = r.json()["choices"][0]["message"]["content"]
        second = first + [{"role": "assistant", "content": reply},
                          {"role": "user", "content": "And another one?"}]
        r = _chat(url, second)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_more_clients_than_the_batches_hold_are_all_answered(url):
    # two replicas of batch 8 take 16 in flight; the other 8 wait in Ray Serve for room
    def ask(i: int) -> httpx.Response:
        return _chat(url, [{"role": "user", "content": f"Question number {i}?"}], max_tokens=6)
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(ask, range(24)))
    assert [a.status_code for a in answers] == [200] * 24
    assert all(a.json()["choices"][0]["message"]["content"] for a in answers)


def test_streams_and_errors_are_hybrid_serves(url):
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=120,
                      json={"model": "demo", "stream": True, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3
    bad = _chat(url, [{"role": "user", "content": "hi"}], max_tokens=-1)
    assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
    missing = httpx.get(url + "/v1/nothing-here", timeout=30)
    assert missing.status_code == 404 and "error" in missing.json()
    ollama = httpx.post(url + "/api/chat", timeout=30, json={"model": "demo", "stream": False,
                                                             "messages": "not a list"})
    assert ollama.status_code == 400 and isinstance(ollama.json()["error"], str)
    models = httpx.get(url + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["demo"]


def test_metrics_label_every_replica(url):
    assert len(_replica_names(url)) == 2
    text = httpx.get(url + "/metrics", timeout=30).text
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families))  # each family once, its samples together


def test_health_sums_every_replicas_counters(url):
    _replica_names(url)  # both replicas have reported
    health = httpx.get(url + "/health", timeout=30).json()
    assert health["status"] == "ok" and len(health["replicas"]) == 2
    each = health["replicas"].values()
    assert health["num_submitted"] == sum(h["num_submitted"] for h in each) > 0
    assert health["kv_pages_total"] == sum(h["kv_pages_total"] for h in each)


def test_a_killed_replica_fails_cleanly_and_the_endpoint_keeps_answering(url):
    # a replica's actor, by Ray Serve's naming of replica actors (namespace "serve")
    victim = f"SERVE_REPLICA::{deployment.APP_NAME}#engine#{min(_replica_names(url))}"

    def stream(i: int) -> tuple[int, list[str]]:
        body = {"model": "demo", "stream": True, "max_tokens": 48, "temperature": 0,
                "messages": [{"role": "user", "content": f"Tell a long story {i}."}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            return r.status_code, [line for line in r.iter_lines() if line]
    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(stream, i) for i in range(8)]
        time.sleep(1.0)
        ray.kill(ray.get_actor(victim, namespace="serve"))
        results = [f.result(timeout=180) for f in running]
    for status, lines in results:  # finished, or failed cleanly: never hung or garbled
        if status == 200:
            last = lines[-1]
            assert last == "data: [DONE]" or json.loads(last[6:])["error"]["code"] == \
                "replica_lost", last
        else:
            assert status == 503
    answered = []
    for i in range(10):
        r = _chat(url, [{"role": "user", "content": f"Still there {i}?"}])
        answered.append(r.status_code)
        assert r.status_code in (200, 503)
    assert answered[-5:] == [200] * 5, answered
    deadline = time.monotonic() + 300  # Ray Serve starts a replacement (a model load)
    while _running_replicas() < 2 and time.monotonic() < deadline:
        time.sleep(2)
    assert _running_replicas() == 2
