"""The FastAPI application: the OpenAI and Ollama routes, /metrics, errors in each API's shape,
API key and body-size middleware."""

from __future__ import annotations

from fastapi import FastAPI

from server.errors import install_error_handlers
from server.metrics import ServerMetrics
from server.metrics import router as metrics_router
from server.middleware import (
    APIKeyMiddleware,
    BodySizeLimitMiddleware,
    DrainMiddleware,
    UnexpectedErrorMiddleware,
)
from server.ollama import router as ollama_router
from server.routes import router
from server.state import ServerState


def create_app(state: ServerState) -> FastAPI:
    """An app serving `state.model` through `state.worker` (started and stopped by the caller)."""
    app = FastAPI(title="hybrid", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hybrid = state
    app.state.metrics = ServerMetrics()  # per app, observed by server/generation.py
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(ollama_router)
    app.include_router(metrics_router)
    # NOTE: the last middleware added runs first: the key is checked before the body is read,
    # and an unexpected error is answered innermost, before Starlette would re-raise it.
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=state.config.max_request_bytes)
    if state.config.api_key is not None:
        app.add_middleware(APIKeyMiddleware, api_key=state.config.api_key)
    app.add_middleware(DrainMiddleware, draining=state.draining)
    return app
