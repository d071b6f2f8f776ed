"""bench_serve_peer's client sends a request again once when the server dropped it before any
response (llama-server closing an idle keep-alive connection as a request arrives on it), and
only then: against a server whose first connection closes on the first request it reads."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from bench_serve_peer import _stream
from openai import APIConnectionError, AsyncOpenAI


def _sse(tokens: list[str]) -> bytes:
    events = b"".join(
        b"data: " + json.dumps({"id": "c", "object": "text_completion", "created": 0,
                                "model": "m", "choices": [{"index": 0, "text": t,
                                                           "finish_reason": None}]}).encode()
        + b"\n\n" for t in tokens) + b"data: [DONE]\n\n"
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
            + str(len(events)).encode() + b"\r\n\r\n" + events)


async def _serve_after_drops(drops: int):
    """A server that reads and drops the first `drops` requests, then streams three tokens."""
    seen = {"requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            seen["requests"] += 1
            if seen["requests"] <= drops:
                writer.close()  # no response: as a keep-alive close racing the request
                return
            writer.write(_sse(["a", "b", "c"]))
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


async def _one(drops: int):
    server, seen = await _serve_after_drops(drops)
    port = server.sockets[0].getsockname()[1]
    try:
        async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=30) as client:
            t = await _stream(client, "m", [1, 2, 3], 3, {"temperature": 0.0, "top_p": 1.0})
        return t, seen["requests"]
    finally:
        server.close()


def test_a_dropped_request_is_sent_again_once_and_timed_from_then() -> None:
    t, requests = asyncio.run(_one(drops=1))
    assert requests == 2 and len(t.stamps) == 3 and t.ttft >= 0


def test_a_second_drop_is_an_error() -> None:
    with pytest.raises(APIConnectionError):
        asyncio.run(_one(drops=2))
