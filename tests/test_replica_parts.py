"""The parts of `hybrid cluster` that need no Ray: the affinity key a conversation keeps, the
replica rendezvous hashing gives it, the merged /metrics and /health, and a request run through a served
app the way a replica runs it (server/replicas/)."""

from __future__ import annotations

import asyncio
import json

from server.replicas.affinity import affinity_key, rendezvous_order
from server.replicas.asgi_call import HttpCall, ResponseStart, run_asgi
from server.replicas.metrics_merge import merge, merge_health


def test_affinity_keys_follow_the_conversation():
    first = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]}
    later = {"messages": first["messages"] + [{"role": "assistant", "content": "b"},
                                              {"role": "user", "content": "c"}]}
    other = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "z"}]}
    key = affinity_key("/v1/chat/completions", json.dumps(first).encode())
    assert key == affinity_key("/v1/chat/completions", json.dumps(later).encode())
    assert key != affinity_key("/v1/chat/completions", json.dumps(other).encode())
    assert affinity_key("/api/chat", json.dumps(first).encode()) == key
    assert affinity_key("/v1/models", b"") is None
    assert affinity_key("/v1/chat/completions", b"not json") is None
    prompt = {"prompt": "x" * 600}
    assert affinity_key("/v1/completions", json.dumps(prompt).encode()) == \
        affinity_key("/v1/completions", json.dumps({"prompt": "x" * 512 + "y"}).encode())


def test_rendezvous_moves_only_the_keys_of_a_replica_that_leaves():
    keys = [f"k{i}" for i in range(200)]
    three = {k: rendezvous_order(k, ["a", "b", "c"])[0] for k in keys}
    two = {k: rendezvous_order(k, ["a", "c"])[0] for k in keys}
    assert all(two[k] == three[k] for k in keys if three[k] != "b")
    assert 40 < sum(v == "b" for v in three.values()) < 95  # spread


def test_metrics_merge_writes_each_family_once():
    a = "# HELP m_total M.\n# TYPE m_total counter\nm_total 3\n# TYPE h histogram\n" \
        'h_bucket{le="1"} 1\nh_sum 0.5\nh_count 1\n'
    got = merge({"r1": a, "r2": a.replace("3", "4")})
    assert got.count("# TYPE m_total counter") == 1 and got.count("# TYPE h histogram") == 1
    assert 'm_total{replica="r1"} 3' in got and 'm_total{replica="r2"} 4' in got
    assert 'h_bucket{replica="r2",le="1"} 1' in got
    lines = got.splitlines()
    assert lines.index("# TYPE h histogram") < lines.index('h_sum{replica="r1"} 0.5')


def test_run_asgi_streams_the_apps_response_and_tells_it_of_a_disconnect():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    seen = {}

    async def echo(request):
        return JSONResponse({"got": json.loads(await request.body()), "q": request.url.query,
                             "h": request.headers.get("x-test")}, status_code=201)

    async def forever(request):
        async def chunks():
            for i in range(1000):
                if await request.is_disconnected():
                    seen["disconnected"] = i
                    return
                yield f"{i}\n".encode()
                await asyncio.sleep(0)
        return StreamingResponse(chunks(), media_type="text/plain")
    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/forever", forever)])

    async def collect(call, limit=None):
        parts = []
        agen = run_asgi(app, call)
        async for part in agen:
            parts.append(part)
            if limit is not None and len(parts) >= limit:
                break
        await agen.aclose()
        return parts
    call = HttpCall("POST", "/echo", b"a=1", ((b"X-Test", b"yes"),), b'{"k": 2}')
    start, *body = asyncio.run(collect(call))
    assert isinstance(start, ResponseStart) and start.status == 201
    assert json.loads(b"".join(body)) == {"got": {"k": 2}, "q": "a=1", "h": "yes"}
    parts = asyncio.run(collect(HttpCall("GET", "/forever", b"", (), b""), limit=4))
    assert parts[1:] == [b"0\n", b"1\n", b"2\n"] and "disconnected" in seen


def test_health_merge_sums_the_counters_and_keeps_each_replica():
    a = {"status": "ok", "model": "demo", "num_running": 2, "num_finished": 10,
         "max_running": 4, "kv_page_size": 64, "kv_pages_used": 3}
    b = {**a, "num_running": 1, "num_finished": 5, "max_running": 7, "kv_pages_used": 0}
    got = merge_health({"r1": a, "r2": b})
    assert (got["status"], got["model"]) == ("ok", "demo")
    assert (got["num_running"], got["num_finished"], got["kv_pages_used"]) == (3, 15, 3)
    assert (got["max_running"], got["kv_page_size"]) == (7, 64)  # the most, not a sum
    assert got["replicas"] == {"r1": a, "r2": b}
