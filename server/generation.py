"""Bridge from an asyncio handler to the engine worker thread, with cancel on disconnect.

One HTTP request runs as one engine `Request` per choice. The worker calls each request's sink
from its thread; the sink hops onto the handler's event loop (`call_soon_threadsafe`), so the
handler reads `(choice index, event)` pairs from an asyncio queue in generation order. When the
client disconnects, or the handler stops reading for any reason (an exception, a cancelled
streaming response), every choice is cancelled at once, queued or running. Each token read is
also timed for /metrics (time to first token, inter-token latency) when the app keeps metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request as HTTPRequest

from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import Request, RequestEvent, RequestFailed
from hybrid.engine.worker import EngineWorker
from server.metrics import observer_for

_DISCONNECTED = object()


async def generate(worker: EngineWorker, request_id: str,
                   jobs: list[tuple[list[int], SamplingParams]],
                   http_request: HTTPRequest) -> AsyncIterator[tuple[int, RequestEvent]]:
    """Yield (choice index, event) until every choice has ended; jobs: (prompt ids, params)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def sink_for(index: int):
        def sink(event: RequestEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (index, event))

        return sink

    requests = [Request(f"{request_id}-{i}", ids, params, sink_for(i))
                for i, (ids, params) in enumerate(jobs)]
    observer = observer_for(http_request, len(jobs))
    watcher = asyncio.create_task(_wait_for_disconnect(http_request, queue))
    try:
        for r in requests:
            worker.submit(r)
        remaining = len(requests)
        while remaining:
            item = await queue.get()
            if item is _DISCONNECTED:
                return
            index, event = item
            if isinstance(event, RequestFailed) or event.finish_reason is not None:
                remaining -= 1
            if observer is not None and not isinstance(event, RequestFailed):
                observer.token(index)
            yield index, event
    finally:
        watcher.cancel()
        for r in requests:
            worker.cancel(r)  # a no-op for a request that has already finished


async def _wait_for_disconnect(http_request: HTTPRequest, queue: asyncio.Queue[Any]) -> None:
    # The body has been read, so the next ASGI message is the client going away.
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait(_DISCONNECTED)
            return
