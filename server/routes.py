"""The OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models; and /health."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import asdict

from fastapi import APIRouter
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import RequestFailed
from server.errors import APIError
from server.generation import generate
from server.openai_format import ChatFormat, CompletionFormat, ResponseFormat, sse
from server.params import chat_prompt, check_request, completion_prompts, sampling_params
from server.protocol import ChatCompletionRequest, CompletionRequest, parse_body
from server.state import ServerState

log = logging.getLogger("hybrid.server")
router = APIRouter()


def _state(http_request: HTTPRequest) -> ServerState:
    return http_request.app.state.hybrid


@router.get("/health")
async def health(http_request: HTTPRequest) -> dict:
    """Liveness plus the engine's queue counters (open to probes: no API key needed)."""
    state = _state(http_request)
    return {"status": "ok", "model": state.model.name, **asdict(state.worker.stats())}


@router.get("/v1/models")
async def list_models(http_request: HTTPRequest) -> dict:
    model = _state(http_request).model
    return {"object": "list", "data": [
        {"id": model.name, "object": "model", "created": model.created, "owned_by": "hybrid"}]}


@router.get("/v1/models/{name:path}")
async def get_model(name: str, http_request: HTTPRequest) -> dict:
    model = _state(http_request).model
    if name != model.name:
        raise APIError(404, f"the model {name!r} does not exist", param="model",
                       code="model_not_found")
    return {"id": model.name, "object": "model", "created": model.created, "owned_by": "hybrid"}


@router.post("/v1/chat/completions")
async def chat_completions(http_request: HTTPRequest) -> Response:
    state = _state(http_request)
    req = parse_body(await http_request.body(), ChatCompletionRequest)
    check_request(req, state)
    prompt = chat_prompt(req, state)
    ids = prompt.ids
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    jobs = [(ids, sampling_params(req, state, len(ids), i, logprobs, prompt))
            for i in range(req.n)]
    fmt = ChatFormat(f"chatcmpl-{uuid.uuid4().hex}", state.model.name, state.model.tokenizer,
                     req.logprobs, think=prompt.think, tools=prompt.tools)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return await _respond(state, http_request, fmt, jobs, len(ids), req.stream, include_usage)


@router.post("/v1/completions")
async def completions(http_request: HTTPRequest) -> Response:
    state = _state(http_request)
    req = parse_body(await http_request.body(), CompletionRequest)
    prompts = completion_prompts(req, state)
    check_request(req, state, num_prompts=len(prompts))
    jobs = [(ids, sampling_params(req, state, len(ids), p * req.n + i, req.logprobs))
            for p, ids in enumerate(prompts) for i in range(req.n)]
    fmt = CompletionFormat(f"cmpl-{uuid.uuid4().hex}", state.model.name, state.model.tokenizer,
                           req.logprobs is not None)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    prompt_tokens = sum(len(ids) for ids in prompts)
    return await _respond(state, http_request, fmt, jobs, prompt_tokens, req.stream, include_usage)


async def _respond(state: ServerState, http_request: HTTPRequest, fmt: ResponseFormat,
                   jobs: list[tuple[list[int], SamplingParams]], prompt_tokens: int, stream: bool,
                   include_usage: bool) -> Response:
    events = generate(state.worker, fmt.id, jobs, http_request)
    if stream:
        body = _stream(fmt, events, len(jobs), prompt_tokens, include_usage)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    choices = [fmt.new_choice() for _ in jobs]
    async for index, event in events:
        if isinstance(event, RequestFailed):
            await events.aclose()  # cancels the other choices
            raise APIError(500, event.message, type="server_error", code="generation_failed")
        choices[index].add(event)
    if any(c.finish_reason is None for c in choices):
        # The client went away before the answer was ready; nobody reads this.
        return Response(status_code=499)
    return JSONResponse(fmt.response(choices, prompt_tokens))


async def _stream(fmt: ResponseFormat, events: AsyncGenerator, num_choices: int,
                  prompt_tokens: int, include_usage: bool) -> AsyncIterator[bytes]:
    """SSE: `data: {chunk}` per token (held-back stop-string text and partial think tags are
    never sent), then usage when asked, then `data: [DONE]`."""
    choices = [fmt.new_choice() for _ in range(num_choices)]
    extra = {"usage": None} if include_usage else {}
    for chunk in fmt.first_chunks(num_choices):
        yield sse({**chunk, **extra})
    try:
        async for index, event in events:
            if isinstance(event, RequestFailed):
                err = APIError(500, event.message, type="server_error", code="generation_failed")
                yield sse(err.body())
                return
            choice = choices[index]
            offset = len(choice.text)
            piece = choice.add(event)
            if piece.reasoning or piece.content or piece.tool_calls or event.finish_reason \
                    or fmt.logprobs:
                yield sse({**fmt.chunk(index, choice, event, piece, offset), **extra})
        if include_usage:
            yield sse(fmt.usage_chunk(choices, prompt_tokens))
        yield sse("[DONE]")
    finally:
        await events.aclose()  # NOTE: runs on disconnect too, cancelling the engine requests
