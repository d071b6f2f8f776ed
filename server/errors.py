"""OpenAI-shaped errors: every failure the server returns is `{"error": {message, type, param,
code}}`, whatever raised it (our checks, routing 404/405, the body-size cap, a bug). Under
`/api/` (the Ollama routes) the same errors take Ollama's shape, `{"error": message}`."""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("hybrid.server")


class APIError(Exception):
    """A request the server refuses; becomes an OpenAI error body with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def body_for(self, path: str) -> dict:
        """The body for a request to `path`: Ollama's shape under /api/, else OpenAI's."""
        return {"error": self.message} if is_ollama_path(path) else self.body()

    def response(self, path: str = "") -> JSONResponse:
        """The error for a request to `path` (Ollama's shape under /api/)."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body_for(path), status_code=self.status, headers=headers)


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unsupported(param: str, what: str) -> APIError:
    """A parameter we do not honour yet: refused, never silently ignored."""
    return APIError(400, f"{param}: {what} is not supported by this server yet", param=param,
                    code="unsupported_parameter")


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail) or HTTPStatus(exc.status_code).phrase
        type_ = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        err = APIError(exc.status_code, message, type=type_, code=_HTTP_CODES.get(exc.status_code))
        response = err.response(request.url.path)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return bad_request(f"{param or 'request'}: {first.get('msg', 'invalid')}",
                           param).response(request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal error: {type(exc).__name__}", type="server_error",
                        code="internal_error").response(request.url.path)
