"""Turn a validated request into prompt token ids and per-choice `SamplingParams`.

Everything a client can get wrong that the schema cannot see is checked here and refused with
a 400 naming the field: unknown model (404), unsupported features, token limits. The OpenAI
routes and the Ollama routes share `encode_chat`, `check_prompt` and `make_sampling_params`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.errors import HybridError
from server.errors import APIError, bad_request, unsupported
from server.protocol import MAX_CHOICES, ChatCompletionRequest, ChatMessage, CompletionRequest
from server.reasoning import THINK_PREFIX, ThinkSetup, opens_think
from server.state import ServerState
from server.tools.formats import ToolFormat
from server.tools.setup import (
    ToolSetup,
    add_tools_to_messages,
    history_tool_calls,
    openai_tools,
    tool_request,
)

log = logging.getLogger("hybrid.server")

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


# OpenAI's documented fields that only steer its own service: accepted, named in a log line
IGNORED_FIELDS = frozenset({"store", "metadata", "service_tier", "verbosity", "prompt_cache_key",
                            "safety_identifier", "web_search_options", "prediction"})
# "none" and "minimal" turn a thinking model's reasoning off; the others leave it on
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


def check_request(req: ChatCompletionRequest | CompletionRequest, state: ServerState,
                  num_prompts: int = 1) -> None:
    if req.model != state.model.name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves "
                       f"{state.model.name!r}", param="model", code="model_not_found")
    if req.n * num_prompts > MAX_CHOICES:
        raise bad_request(f"n times the number of prompts is {req.n * num_prompts}; at most "
                          f"{MAX_CHOICES} choices per request", "n")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if req.best_of is not None and req.best_of != req.n:
        raise unsupported("best_of", "best_of other than n")
    if req.logit_bias:
        raise unsupported("logit_bias", "logit_bias")
    if isinstance(req, ChatCompletionRequest):
        if req.audio is not None:
            raise unsupported("audio", "audio output (this server writes text)")
        if req.modalities is not None and set(req.modalities) - {"text"}:
            raise unsupported("modalities", "audio output (this server writes text; "
                                            "modalities [\"text\"] is)")
        if req.reasoning_effort not in (None, *REASONING_EFFORTS):
            raise bad_request(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}",
                              "reasoning_effort")
    ignored = sorted(set(req.model_fields_set) & IGNORED_FIELDS)
    if ignored or req.user:
        log.info("request%s: ignoring %s", f" from user {req.user!r}" if req.user else "",
                 ", ".join(ignored) or "nothing")


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]
    think: ThinkSetup | None  # how the output splits into reasoning and answer; None: no split
    tools: ToolSetup | None = None  # how tool calls are parsed (and maybe required)

    @property
    def opens_think(self) -> bool:
        return self.think is not None and self.think.in_think


def chat_prompt(req: ChatCompletionRequest, state: ServerState) -> ChatPrompt:
    """Render the messages (and tools) with the model's chat template and tokenize them."""
    kind = (req.response_format or {}).get("type", "text")
    if kind not in ("text", "json_object", "json_schema"):
        raise unsupported("response_format", f"response_format of type {kind!r} (text, "
                                             "json_object and json_schema are)")
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    tokenizer = state.model.tokenizer
    fmt = state.model.chat.tool_format
    tools, choice = openai_tools(req)
    tools_setup, tools = tool_request(tools, choice, req.parallel_tool_calls, tokenizer, fmt)
    if tools_setup is not None and tools_setup.forced and kind != "text":
        raise bad_request("a required tool call and response_format cannot both constrain the "
                          "reply; drop one", "response_format")
    messages = [chat_message(m, f"messages.{i}", fmt) for i, m in enumerate(req.messages)]
    if tools_setup is not None:
        messages = add_tools_to_messages(messages, tools, tools_setup,
                                         tokenizer.chat_template.source)
    think = None if req.reasoning_effort is None else req.reasoning_effort not in ("none",
                                                                                "minimal")
    prompt = encode_chat(messages, state, "messages", tools=tools or None, think=think)
    return ChatPrompt(prompt.ids, prompt.think, tools_setup)


def chat_message(m: ChatMessage, where: str, fmt: ToolFormat) -> dict[str, Any]:
    """One OpenAI message as the templates read it."""
    role = {"function": "tool"}.get(m.role, m.role)
    if role not in (*CHAT_ROLES, "tool"):
        raise bad_request(f"{where}.role: unknown role {m.role!r}; use one of "
                          f"{', '.join(CHAT_ROLES)}, tool", f"{where}.role")
    if m.tool_calls is not None and role != "assistant":
        raise bad_request(f"{where}.tool_calls: only assistant messages make tool calls",
                          f"{where}.tool_calls")
    if m.reasoning_content is not None and role != "assistant":
        raise bad_request(f"{where}.reasoning_content: only assistant messages carry "
                          "reasoning", f"{where}.reasoning_content")
    reasoning = {} if m.reasoning_content is None else {"reasoning_content": m.reasoning_content}
    if role == "assistant" and m.tool_calls:
        text = _content_text(m.content, where) if m.content is not None else ""
        return {**calling_turn(text, history_tool_calls(m.tool_calls, where, fmt), fmt),
                **reasoning}
    message = {"role": CHAT_ROLES.get(role, role), "content": _content_text(m.content, where),
               **reasoning}
    if role == "tool":
        message["tool_call_id"] = m.tool_call_id or ""
        if m.name:
            message["name"] = m.name
    return message


def calling_turn(text: str, calls: list[dict[str, Any]], fmt: ToolFormat) -> dict[str, Any]:
    """An assistant turn that calls tools (with no text: the format's call-only content)."""
    return {"role": "assistant", "content": text or fmt.call_only_content, "tool_calls": calls}


def encode_chat(messages: list[dict[str, Any]], state: ServerState, param: str,
                tools: list[dict[str, Any]] | None = None,
                think: bool | None = None) -> ChatPrompt:
    """Checked messages -> the prompt, ending with "<think>\n" under --force-think. `think`
    (from reasoning_effort) switches a thinking model's reasoning on or off for this request:
    the template's `thinking` variable (DeepSeek V3.1's, our V3.2's), or `enable_thinking`
    (the name other V3.2 templates read), and --force-think's prefix follow it."""
    tokenizer = state.model.tokenizer
    extra = {} if think is None else {"thinking": think, "enable_thinking": think}
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, **extra)
    except HybridError as e:
        raise bad_request(str(e), param) from None
    force = state.config.force_think if think is None else state.config.force_think and think
    thinking = force or state.model.chat.thinking_template
    if force and not opens_think(text):
        text += THINK_PREFIX
    bos = tokenizer.id_to_token(tokenizer.bos_token_id)  # the template writes its own BOS
    ids = tokenizer.encode(text, add_bos=not (bos and text.startswith(bos)))
    check_prompt(ids, state, param)
    return ChatPrompt(ids, ThinkSetup(thinking and opens_think(text), state.model.chat.think_tags))


def _content_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_request(f"{where}.content is required", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind != "text":
            raise unsupported(f"{where}.content.{j}.type", f"content of type {kind!r}")
        if set(part) != {"type", "text"} or not isinstance(part["text"], str):
            raise bad_request(f"{where}.content.{j}: a text part is {{'type': 'text', 'text': "
                              "str}", f"{where}.content.{j}")
        texts.append(part["text"])
    return "\n".join(texts)


def completion_prompts(req: CompletionRequest, state: ServerState) -> list[list[int]]:
    """Each prompt as token ids: a string, a list of strings, ids, or a list of id lists."""
    if req.echo:
        raise unsupported("echo", "echo")
    if req.suffix:
        raise unsupported("suffix", "suffix")
    p = req.prompt
    if isinstance(p, str):
        prompts = [state.model.tokenizer.encode(p)]
    elif not p:
        raise bad_request("prompt must not be empty", "prompt")
    elif isinstance(p[0], str):
        prompts = [state.model.tokenizer.encode(s) for s in p]  # type: ignore[arg-type]
    elif isinstance(p[0], int):
        prompts = [list(p)]  # type: ignore[arg-type]
    else:
        prompts = [list(ids) for ids in p]  # type: ignore[union-attr]
    for ids in prompts:
        check_prompt(ids, state, "prompt")
    return prompts


def check_prompt(ids: list[int], state: ServerState, param: str) -> None:
    if not ids:
        raise bad_request(f"{param}: the prompt is empty", param)
    vocab = state.model.vocab_size
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise bad_request(f"{param}: token id {bad} is outside the vocabulary (0..{vocab - 1})",
                          param)
    m = state.model
    if len(ids) >= m.max_request_tokens:
        where = ("the model's context" if m.max_request_tokens == m.context_length else
                 f"the server's KV cache (--cache-lens {state.worker.engine.config.cache_lens})")
        raise bad_request(f"{param}: the prompt has {len(ids)} tokens but a request may hold at "
                          f"most {m.max_request_tokens} tokens, prompt and output ({where}); "
                          f"shorten the prompt", param, code="context_length_exceeded")


def sampling_params(req: ChatCompletionRequest | CompletionRequest, state: ServerState,
                    prompt_len: int, index: int, logprobs: int | None,
                    prompt: ChatPrompt | None = None) -> SamplingParams:
    """Choice `index`'s settings. Its seed is `seed + index`, so n > 1 gives n samples.
    A chat `prompt` whose tools require a call constrains the reply to one."""
    mct = getattr(req, "max_completion_tokens", None)  # chat's newer name wins when both are set
    param, asked = ("max_completion_tokens", mct) if mct is not None else ("max_tokens",
                                                                            req.max_tokens)
    if asked is not None and asked <= 0:
        raise bad_request(f"{param} must be at least 1, got {asked}", param)
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    given = {name: getattr(req, name) for name in SAMPLING_FIELDS}
    fmt = getattr(req, "response_format", None) or {}
    grammar = None
    if fmt.get("type") in ("json_object", "json_schema"):
        grammar = structured_grammar(fmt, "response_format", state.config.lenient_schemas)
    if prompt is not None and prompt.tools is not None and prompt.tools.forced:
        room = min(asked or state.config.max_new_tokens, state.config.max_new_tokens,
                   state.model.max_request_tokens - prompt_len)
        grammar = prompt.tools.grammar(state.model.tokenizer, prompt.opens_think, room,
                                       state.config.lenient_schemas)
    return make_sampling_params(
        state, prompt_len, asked, stop=stop, logprobs=logprobs, ignore_eos=req.ignore_eos,
        seed=None if req.seed is None else req.seed + index, grammar=grammar,
        **{k: v for k, v in given.items() if v is not None})


def structured_grammar(response_format: dict[str, Any], param: str,
                       lenient: bool = False) -> str:
    """The grammar of an OpenAI-style response_format (json_object or json_schema); a 400
    naming `param` when the schema cannot be used. Objects take no keys their schema does not
    list unless `lenient` (--lenient-schemas)."""
    from hybrid.engine.sampling.grammar import json_grammar, schema_of
    from hybrid.errors import RequestRejected

    try:
        return json_grammar(schema_of(response_format), lenient)
    except RequestRejected as e:
        raise bad_request(str(e), param) from None


# Request fields that map one to one onto SamplingParams (None: the engine's default).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                   "frequency_penalty", "repetition_penalty")


def make_sampling_params(state: ServerState, prompt_len: int, asked_tokens: int | None,
                         **values: Any) -> SamplingParams:
    """SamplingParams with max_tokens clamped to the server's cap and the context left after
    the prompt; the request then ends with finish_reason "length", as a client asking for more
    than allowed expects. A bad value is a 400 naming it."""
    room = state.model.max_request_tokens - prompt_len
    cap = state.config.max_new_tokens
    values["max_tokens"] = min(asked_tokens or cap, cap, room)
    if any(not s for s in values.get("stop", ())):
        raise bad_request("stop strings must not be empty", "stop")
    if values.get("top_k") is not None:
        values["top_k"] = max(values["top_k"], 0)  # -1 (vLLM) and 0 both mean off
    try:
        return SamplingParams(**values)
    except HybridError as e:
        param = next((k for k in values if str(e).startswith(k)), None)
        raise bad_request(str(e), param) from None
