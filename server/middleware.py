"""ASGI middleware run before routing: the API key check, the request body-size cap, and the
500 of an unexpected error that keeps the connection open.

Both answer with OpenAI-shaped errors (Ollama-shaped under /api/). The size cap looks at Content-Length first and also
counts the bytes of chunked bodies as they arrive, so no body larger than the cap is ever
buffered whole.
"""

from __future__ import annotations

import hmac
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import APIError

OPEN_PATHS = ("/health",)  # left open for load balancers and probes
log = logging.getLogger("hybrid.server")


class UnexpectedErrorMiddleware:
    """An exception no handler took becomes a 500 in the API's shape, and goes no further.

    Starlette's own last-resort handler sends its 500 and then raises the exception again, and
    uvicorn closes the connection of an app that raised: a client's next request on that
    keep-alive connection fails with "connection reset". Here it stops, so the connection
    serves on. A response already started (a stream) cannot become a 500: it ends there."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the last resort: logged, answered, contained
            log.exception("unexpected error on %s %s", scope.get("method"), scope["path"])
            if not started:
                err = APIError(500, f"internal error: {type(exc).__name__}",
                               type="server_error", code="internal_error")
                await err.response(scope["path"])(scope, receive, send)


def api_key_refusal(given: bytes | None, api_key: str) -> APIError | None:
    """The 401 for an `Authorization` header value (None: absent) that does not carry
    `Bearer <api_key>`; None where it does."""
    if given is None:
        return APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                        code="invalid_api_key")
    if not hmac.compare_digest(given, f"Bearer {api_key}".encode()):  # constant time
        return APIError(401, "incorrect API key provided", code="invalid_api_key")
    return None


class APIKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        err = api_key_refusal(dict(scope["headers"]).get(b"authorization"), self.api_key)
        if err is None:
            return await self.app(scope, receive, send)
        await err.response(scope["path"])(scope, receive, send)


class DrainMiddleware:
    """While the server shuts down (server/lifecycle.py): a 503 with Retry-After for every
    request, /health included, so clients and load balancers go elsewhere or come back."""

    RETRY_AFTER_S = 10

    def __init__(self, app: ASGIApp, draining) -> None:  # draining: threading.Event
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.draining.is_set():
            return await self.app(scope, receive, send)
        err = APIError(503, "the server is shutting down: it finishes the requests it has "
                       "and takes no new ones; retry later or on another server",
                       type="server_error", code="server_shutting_down")
        response = err.response(scope["path"])
        response.headers["Retry-After"] = str(self.RETRY_AFTER_S)
        await response(scope, receive, send)


class BodySizeLimitMiddleware:
    """Refuse request bodies over `max_bytes` with a 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than the server's limit of "
                        f"{self.max_bytes} bytes", code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                err = APIError(400, "the Content-Length header is not a number",
                               code="invalid_request")
                return await err.response(scope["path"])(scope, receive, send)
            if int(length) > self.max_bytes:
                return await self._too_large().response(scope["path"])(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large()  # the app's handler turns it into the 413
            return message

        await self.app(scope, counting_receive, send)
