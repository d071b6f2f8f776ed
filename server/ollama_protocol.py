"""The Ollama request bodies we accept (strict pydantic, as for OpenAI), and their mapping onto
prompts and `SamplingParams` through the same helpers the OpenAI routes use.

Sampling defaults are Ollama's own (temperature 0.8, top_k 40, top_p 0.9) except
`repeat_penalty`, which stays off: ours applies to the whole prompt and output (vLLM's
semantics), not to Ollama's last 64 tokens, so Ollama's 1.1 would not mean the same.
Options that only set up Ollama's runner (num_ctx, num_thread, ...) do not change the output
and are accepted and ignored; any other unknown option is a 400, never silently ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from hybrid.engine.sampling.sampling_params import SamplingParams
from server.errors import APIError, bad_request, unsupported
from server.params import (
    ChatPrompt,
    calling_turn,
    check_prompt,
    encode_chat,
    make_sampling_params,
    structured_grammar,
)
from server.protocol import StopField, StrictModel
from server.reasoning import ThinkSetup, opens_think
from server.state import ServerState
from server.tools.setup import add_tools_to_messages, history_tool_calls, tool_request

OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
OLLAMA_ROLES = ("system", "user", "assistant", "tool")


class OllamaOptions(StrictModel):
    num_predict: int | None = None  # -1: no limit, -2: fill the context (both: the server cap)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 63)
    stop: StopField = None
    repeat_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Runner settings: accepted and ignored (they do not change what is generated).
    num_ctx: int | None = None
    num_keep: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    use_mmap: bool | None = None
    numa: bool | None = None


class OllamaMessage(StrictModel):
    role: str
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None
    thinking: str | None = None  # an earlier turn's reasoning: dropped, as R1's template does


class _OllamaFields(StrictModel):
    model: str
    stream: bool = True  # Ollama streams unless told not to
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None
    keep_alive: str | int | float | None = None  # accepted and ignored: the model stays loaded
    think: bool | None = None  # False: no split, the reasoning stays in the answer text


class OllamaChatRequest(_OllamaFields):
    messages: list[OllamaMessage] = Field(default_factory=list)  # empty: just "load"
    tools: list[Any] | None = None


class OllamaGenerateRequest(_OllamaFields):
    prompt: str = ""  # empty: just "load"
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None


class OllamaShowRequest(StrictModel):
    model: str | None = None
    name: str | None = None  # Ollama's older name for `model`
    verbose: bool | None = None


def check_model(name: str | None, state: ServerState) -> None:
    """Ollama names carry a tag; "NAME:latest" is the served NAME too."""
    served = state.model.name
    if name not in (served, f"{served}:latest"):
        raise APIError(404, f"model {name!r} not found; this server serves {served!r}",
                       param="model", code="model_not_found")


def _check_common(req: _OllamaFields) -> None:
    if req.format not in (None, "", "json") and not isinstance(req.format, dict):
        raise bad_request(f"format must be \"json\" or a JSON schema object, got "
                          f"{req.format!r}", "format")


def chat_prompt(req: OllamaChatRequest, state: ServerState) -> ChatPrompt:
    """The messages (and tools: Ollama's are OpenAI's, always with choice "auto") rendered."""
    _check_common(req)
    tokenizer = state.model.tokenizer
    fmt = state.model.chat.tool_format
    setup, tools = tool_request(req.tools, None, None, tokenizer, fmt)
    messages = []
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if m.role not in OLLAMA_ROLES:
            raise bad_request(f"{where}.role: unknown role {m.role!r}; use one of "
                              f"{', '.join(OLLAMA_ROLES)}", f"{where}.role")
        if m.images:
            raise unsupported(f"{where}.images", "images")
        if m.tool_calls is not None and m.role != "assistant":
            raise bad_request(f"{where}.tool_calls: only assistant messages make tool calls",
                              f"{where}.tool_calls")
        if m.tool_calls:
            messages.append(calling_turn(m.content, history_tool_calls(m.tool_calls, where, fmt),
                                         fmt))
        elif m.role == "tool":
            messages.append({"role": "tool", "content": m.content,
                             "tool_call_id": m.tool_name or ""})
        else:
            messages.append({"role": m.role, "content": m.content})
    if setup is not None:
        messages = add_tools_to_messages(messages, tools, setup, tokenizer.chat_template.source)
    prompt = encode_chat(messages, state, "messages", tools=tools or None)
    return _think_off(ChatPrompt(prompt.ids, prompt.think, setup), req)


def generate_prompt(req: OllamaGenerateRequest, state: ServerState) -> ChatPrompt:
    """The prompt as a user turn of the chat template, or as is with `raw`."""
    _check_common(req)
    for name in ("suffix", "template", "images", "context"):
        if getattr(req, name):
            raise unsupported(name, name)
    if not req.raw:
        system = [{"role": "system", "content": req.system}] if req.system else []
        prompt = encode_chat([*system, {"role": "user", "content": req.prompt}], state, "prompt")
        return _think_off(prompt, req)
    if req.system:
        raise bad_request("system has no effect with raw: put it in the prompt", "system")
    tokenizer = state.model.tokenizer
    ids = tokenizer.encode(req.prompt)
    check_prompt(ids, state, "prompt")
    thinking = state.config.force_think or state.model.chat.thinking_template
    think = ThinkSetup(thinking and opens_think(req.prompt), state.model.chat.think_tags)
    return _think_off(ChatPrompt(ids, think), req)


def _think_off(prompt: ChatPrompt, req: _OllamaFields) -> ChatPrompt:
    return prompt if req.think is not False else ChatPrompt(prompt.ids, None, prompt.tools)


def sampling(req: _OllamaFields, state: ServerState, prompt_len: int) -> SamplingParams:
    o = req.options or OllamaOptions()
    if o.num_predict is not None and o.num_predict < 1 and o.num_predict not in (-1, -2):
        raise bad_request(f"options.num_predict must be at least 1, or -1 (no limit) or -2 "
                          f"(fill the context), got {o.num_predict}", "options.num_predict")
    asked = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    given = {"temperature": o.temperature, "top_p": o.top_p, "top_k": o.top_k, "min_p": o.min_p,
             "seed": o.seed, "presence_penalty": o.presence_penalty,
             "frequency_penalty": o.frequency_penalty, "repetition_penalty": o.repeat_penalty}
    values = {**OLLAMA_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}
    stop = (o.stop,) if isinstance(o.stop, str) else tuple(o.stop or ())
    if req.format == "json":  # Ollama's structured output: any JSON object, or a schema
        values["grammar"] = structured_grammar({"type": "json_object"}, "format")
    elif isinstance(req.format, dict):
        values["grammar"] = structured_grammar({"type": "json_schema",
                                                "json_schema": {"schema": req.format}}, "format",
                                               state.config.lenient_schemas)
    return make_sampling_params(state, prompt_len, asked, stop=stop, **values)
