"""One HTTP request carried from the cluster's ingress to an engine replica, and run there
through the replica's own served app (server/app.py) in its process: the routes, checks and
errors are `hybrid serve`'s, streaming included.

    call = await HttpCall.of(request)        ingress: the request, read whole
    async for part in run_asgi(app, call):   replica: ResponseStart, then body chunks (bytes)

No ray import here: the pieces are plain ASGI and run in tests without a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from server.replicas.affinity import affinity_key


@dataclass(frozen=True)
class HttpCall:
    """A request, picklable. `affinity`: what keeps a conversation on one replica (its system
    and first user messages, or a prompt's head, hashed), None where any replica will do."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    affinity: str | None = None

    @classmethod
    async def of(cls, request) -> HttpCall:
        """From a Starlette request (the ingress's)."""
        body = await request.body()
        path = request.url.path
        return cls(request.method, path, request.url.query.encode(),
                   tuple(request.headers.raw), body, affinity_key(path, body))


@dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]


async def run_asgi(app, call: HttpCall) -> AsyncIterator[ResponseStart | bytes]:
    """Run `call` through the ASGI `app` -> ResponseStart, then the body's chunks as the app
    sends them. Closing the iterator early (the client left) tells the app the client
    disconnected, as uvicorn would, and waits for it to finish."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": call.method, "scheme": "http", "path": call.path,
             "raw_path": call.path.encode(), "query_string": call.query, "root_path": "",
             "headers": [(k.lower(), v) for k, v in call.headers],
             "client": ("127.0.0.1", 0), "server": ("hybrid-replica", 80)}
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(None)  # the app returned (or raised): nothing more comes
    task = asyncio.create_task(run())
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], tuple(message.get("headers", ())))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
    finally:
        gone.set()
        await task  # the app's own errors became responses (server/errors.py)
