"""The OpenAI request bodies we accept, validated strictly (pydantic, strict types, no extras).

Unknown fields are refused, as OpenAI does; every documented field is accepted: those that
cannot be honoured (logit_bias, audio output, ...) are refused by `server/params.py` with a 400
that names them, those that only steer OpenAI's own service (store, service_tier, ...) are
ignored with one log line. Beside OpenAI's fields we take vLLM's sampling
extras: top_k, min_p, repetition_penalty and ignore_eos.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from server.errors import bad_request

MAX_CHOICES = 16  # n (times prompts, for completions) per request
MAX_STOP = 4  # stop strings per request, as OpenAI allows


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(StrictModel):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # OpenAI pads chunks against side channels: off


class ChatMessage(StrictModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    # an earlier assistant turn's reasoning, as DeepSeek's API returns it and asks back within
    # a tool loop; the templates that write it (V3.2's, in thinking mode) read it
    reasoning_content: str | None = None


StopField = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None


class _SamplingFields(StrictModel):
    """Fields shared by chat and completions."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extension; 0 or -1 = off
    min_p: float | None = Field(None, ge=0, le=1)  # vLLM's extension; 0 = off
    seed: int | None = Field(None, ge=-(1 << 63), lt=1 << 63)
    stop: StopField = None
    user: str | None = None  # accepted and unused, as it only labels the caller
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)  # vLLM's; 1 = off
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens even past EOS (benchmarks)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    # OpenAI's other documented fields: honoured where they apply (reasoning_effort switches a
    # thinking model's reasoning, user is logged), refused where they cannot be (audio output),
    # otherwise accepted and named in one log line (server/params.py: IGNORED_FIELDS)
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    verbosity: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    web_search_options: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None


def parse_body(raw: bytes, model: type[StrictModel]) -> Any:
    """Decode strict UTF-8 JSON into `model`; any problem is a 400 naming the field."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8 (byte {e.start})",
                          code="invalid_utf8") from None
    if not text.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise _validation_error(e) from None


def _validation_error(e: ValidationError) -> Exception:
    err = e.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {err['msg']}",
                           code="invalid_json")
    loc = [str(p) for p in err["loc"] if not _is_union_tag(p)]
    param = ".".join(loc) or None
    if err["type"] == "model_type" and not loc:
        return bad_request("the request body must be a JSON object", code="invalid_json")
    if err["type"] == "extra_forbidden":
        return bad_request(f"unrecognized request argument supplied: {param}", param,
                           code="unknown_parameter")
    return bad_request(f"{param or 'request'}: {err['msg']}", param)


def _is_union_tag(part: object) -> bool:
    # pydantic names the union member it tried ("str", "list[int]") inside `loc`; users care
    # about the field path only.
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "function-after")
                                      or "[" in part)
