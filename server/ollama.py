"""The Ollama API: /api/chat, /api/generate, /api/tags, /api/show, /api/version.

Ollama clients (the `ollama` CLI and Python package, Open WebUI, ...) talk to this server as to
Ollama. Generation runs through the same `generate()` bridge as the OpenAI routes (so a client
that goes away cancels its request), prompts through the same template and checks. Replies
stream as NDJSON by default, one object per token, then a last object with `done: true`,
`done_reason` and Ollama's counts and durations (nanoseconds); `"stream": false` gives one
object. Reasoning of a thinking model goes to `thinking`, as Ollama reports it. Errors take
Ollama's shape, `{"error": "..."}` (see server/errors.py).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import RequestFailed
from server.errors import APIError, bad_request
from server.generation import generate
from server.ollama_protocol import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
    chat_prompt,
    check_model,
    generate_prompt,
    sampling,
)
from server.openai_format import ChoiceState, Delta
from server.params import ChatPrompt
from server.protocol import parse_body
from server.state import ServerState

router = APIRouter(prefix="/api")

# What one reply object carries: the chat's `message` or generate's `response` (+ `thinking`).
Body = Callable[[Delta], dict[str, Any]]


def _state(http_request: HTTPRequest) -> ServerState:
    return http_request.app.state.hybrid


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _chat_body(piece: Delta) -> dict[str, Any]:
    message = {"role": "assistant", "content": piece.content}
    if piece.reasoning:
        message["thinking"] = piece.reasoning
    return {"message": message}


def _generate_body(piece: Delta) -> dict[str, Any]:
    body: dict[str, Any] = {"response": piece.content}
    if piece.reasoning:
        body["thinking"] = piece.reasoning
    return body


@router.get("/version")
async def version() -> dict:
    return {"version": metadata.version("hybrid")}


@router.get("/tags")
async def tags(http_request: HTTPRequest) -> dict:
    return {"models": [_model_entry(_state(http_request))]}


@router.post("/show")
async def show(http_request: HTTPRequest) -> dict:
    state = _state(http_request)
    req = parse_body(await http_request.body(), OllamaShowRequest)
    if req.model is None and req.name is None:
        raise bad_request("model: Field required", "model")
    check_model(req.model or req.name, state)
    m, template = state.model, state.model.tokenizer.chat_template.source
    thinking = state.config.force_think or m.chat.thinking_template
    entry = _model_entry(state)
    return {
        "modelfile": f"FROM {state.config.engine.gguf_path or m.name}\n", "parameters": "",
        "template": template, "details": entry["details"], "modified_at": entry["modified_at"],
        "model_info": {"general.architecture": "deepseek2",
                       "deepseek2.context_length": m.context_length,
                       "deepseek2.vocab_size": m.vocab_size},
        "capabilities": ["completion", "tools", *(["thinking"] if thinking else [])],
    }


@router.post("/chat")
async def chat(http_request: HTTPRequest) -> Response:
    state = _state(http_request)
    req = parse_body(await http_request.body(), OllamaChatRequest)
    check_model(req.model, state)
    if not req.messages:
        return _loaded(req.model, _chat_body(Delta()))
    prompt = chat_prompt(req, state)
    return await _respond(state, http_request, req.model, prompt, sampling(req, state, len(
        prompt.ids)), req.stream, _chat_body)


@router.post("/generate")
async def generate_route(http_request: HTTPRequest) -> Response:
    state = _state(http_request)
    req = parse_body(await http_request.body(), OllamaGenerateRequest)
    check_model(req.model, state)
    if not req.prompt and not req.raw:
        return _loaded(req.model, _generate_body(Delta()))
    prompt = generate_prompt(req, state)
    return await _respond(state, http_request, req.model, prompt, sampling(req, state, len(
        prompt.ids)), req.stream, _generate_body)


def _loaded(model: str, body: dict[str, Any]) -> JSONResponse:
    """Ollama answers an empty prompt by loading the model; ours is always loaded."""
    return JSONResponse({"model": model, "created_at": _now(), **body, "done": True,
                         "done_reason": "load"})


class _Timing:
    """Ollama's counts and durations (ns): prompt eval = until the first token, eval = after."""

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.start = time.perf_counter_ns()
        self.first: int | None = None
        self.last = self.start
        self.num_tokens = 0

    def token(self) -> None:
        self.last = time.perf_counter_ns()
        self.first = self.first or self.last
        self.num_tokens += 1

    def done(self, reason: str | None) -> dict[str, Any]:
        first = self.first or self.last
        return {"done": True, "done_reason": reason or "stop",
                "total_duration": time.perf_counter_ns() - self.start, "load_duration": 0,
                "prompt_eval_count": self.prompt_tokens, "prompt_eval_duration": first - self.start,
                "eval_count": self.num_tokens, "eval_duration": self.last - first}


async def _respond(state: ServerState, http_request: HTTPRequest, model: str, prompt: ChatPrompt,
                   params: SamplingParams, stream: bool, body: Body) -> Response:
    timing = _Timing(len(prompt.ids))
    events = generate(state.worker, f"ollama-{uuid.uuid4().hex}", [(prompt.ids, params)],
                      http_request)
    choice = ChoiceState(think=prompt.think, tools=prompt.tools)
    if stream:
        lines = _ndjson(model, events, choice, timing, body)
        return StreamingResponse(lines, media_type="application/x-ndjson")
    async for _, event in events:
        if isinstance(event, RequestFailed):
            await events.aclose()
            raise APIError(500, event.message, type="server_error", code="generation_failed")
        choice.add(event)
        timing.token()
    if choice.finish_reason is None:
        return Response(status_code=499)  # the client went away; nobody reads this
    whole = body(Delta(choice.reasoning, choice.text))
    _add_tool_calls(whole, choice)
    return JSONResponse({"model": model, "created_at": _now(), **whole,
                         **timing.done(choice.finish_reason)})


async def _ndjson(model: str, events: AsyncGenerator, choice: ChoiceState, timing: _Timing,
                  body: Body) -> AsyncIterator[bytes]:
    def line(payload: dict[str, Any]) -> bytes:
        return (json.dumps(payload, ensure_ascii=False) + "\n").encode()

    try:
        async for _, event in events:
            if isinstance(event, RequestFailed):
                yield line({"error": event.message})
                return
            piece = choice.add(event)
            timing.token()
            if piece.reasoning or piece.content:
                yield line({"model": model, "created_at": _now(), **body(piece), "done": False})
            if event.finish_reason is not None:
                calls = body(Delta())
                if _add_tool_calls(calls, choice):  # Ollama sends whole calls, then done
                    yield line({"model": model, "created_at": _now(), **calls, "done": False})
                yield line({"model": model, "created_at": _now(), **body(Delta()),
                            **timing.done(event.finish_reason)})
    finally:
        await events.aclose()  # NOTE: runs on disconnect too, cancelling the engine request


def _add_tool_calls(body: dict[str, Any], choice: ChoiceState) -> bool:
    """Put the reply's tool calls into a chat body's message, Ollama's way: arguments as an
    object. A call whose arguments are not a JSON object goes back as text. True if any."""
    if "message" not in body or not choice.tool_calls:
        return False
    calls = []
    for c in choice.tool_calls:
        try:
            args = json.loads(c.arguments or "{}")
        except json.JSONDecodeError:
            args = None
        if isinstance(args, dict):
            calls.append({"function": {"name": c.name, "arguments": args}})
        else:
            body["message"]["content"] += f"{c.name}({c.arguments})"
    if calls:
        body["message"]["tool_calls"] = calls
    return bool(calls)


def _model_entry(state: ServerState) -> dict[str, Any]:
    m = state.model
    path = state.config.engine.gguf_path
    return {
        "name": m.name, "model": m.name,
        "modified_at": datetime.fromtimestamp(m.created, timezone.utc).isoformat(),
        "size": _size_bytes(path),
        # An identifier for this served model, not a hash of the file (that would read it all).
        "digest": hashlib.sha256(f"{m.name}:{path}:{m.created}".encode()).hexdigest(),
        "details": {"parent_model": "", "format": "gguf", "family": "deepseek2",
                    "families": ["deepseek2"], "parameter_size": "", "quantization_level": ""},
    }


def _size_bytes(gguf_path: str | None) -> int:
    """The GGUF's size on disk (all parts of a split set, or a folder's files); 0 if unknown."""
    if gguf_path is None:
        return 0
    path = Path(gguf_path)
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.gguf"))
    parts = path.name.rsplit("-", 3)
    if len(parts) == 4 and parts[2] == "of":  # name-00001-of-00003.gguf: count every part
        return sum(f.stat().st_size for f in path.parent.glob(f"{parts[0]}-*-of-{parts[3]}"))
    return path.stat().st_size if path.is_file() else 0
