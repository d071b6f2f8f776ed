"""ASGI middleware run before routing: the API key check and the request body-size cap.

Both answer with OpenAI-shaped errors (Ollama-shaped under /api/). The size cap looks at Content-Length first and also
counts the bytes of chunked bodies as they arrive, so no body larger than the cap is ever
buffered whole.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import APIError

OPEN_PATHS = ("/health",)  # left open for load balancers and probes


class APIKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer <key>`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization")
        if given is None:
            err = APIError(401, "missing API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
        elif not hmac.compare_digest(given, self.expected):  # constant time: no key guessing
            err = APIError(401, "incorrect API key provided", code="invalid_api_key")
        else:
            return await self.app(scope, receive, send)
        await err.response(scope["path"])(scope, receive, send)


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
