"""Build OpenAI response objects (chat and completions, whole and streamed) from token events."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from hybrid.engine.scheduling.request import TokenOutput
from server.reasoning import ReasoningParser, ThinkSetup
from server.tools.parser import ToolCall, ToolCallDelta, ToolCallParser
from server.tools.setup import ToolSetup


@dataclass(frozen=True)
class Delta:
    """What one token adds to a choice: reasoning (inside <think>), answer text, and pieces of
    tool calls."""

    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass
class ChoiceState:
    """What one choice has produced so far; with `think`, reasoning is split from `text`."""

    text: str = ""  # the answer
    reasoning: str = ""
    tokens: list[TokenOutput] = field(default_factory=list)
    finish_reason: str | None = None
    think: ThinkSetup | None = None
    parser: ReasoningParser | None = None
    cached_tokens: int = 0  # of its prompt, found in the prefix cache
    tools: ToolSetup | None = None
    tool_parser: ToolCallParser | None = None

    def __post_init__(self) -> None:
        if self.think is not None and self.parser is None:
            self.parser = self.think.parser()
        if self.tools is not None and self.tool_parser is None:
            self.tool_parser = self.tools.parser()
        # control tokens the parsers need to see as text (the detokenizer skips them)
        self._control = {**(self.think.tag_text if self.think else {}),
                         **(self.tools.marker_text if self.tools else {})}

    @property
    def has_reasoning(self) -> bool:
        return self.parser is not None and self.parser.saw_think

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.tool_parser.calls if self.tool_parser is not None else []

    def reported_finish(self, reason: str | None) -> str | None:
        """OpenAI's finish_reason: a reply that ended by itself after calling tools says so."""
        return "tool_calls" if reason == "stop" and self.tool_calls else reason

    def add(self, out: TokenOutput) -> Delta:
        self.tokens.append(out)
        self.cached_tokens = out.cached_tokens
        self.finish_reason = out.finish_reason or self.finish_reason
        marker = self._control.get(out.token_id)  # a skipped control token's text, put back
        text = out.text if marker is None or out.text.endswith(marker) else out.text + marker
        done = out.finish_reason is not None
        reasoning, content = "", text
        if self.parser is not None:
            reasoning, content = self.parser.feed(text)
            if done:
                r, c = self.parser.finish()
                reasoning, content = reasoning + r, content + c
        calls: list[ToolCallDelta] = []
        if self.tool_parser is not None:
            content, calls = self.tool_parser.feed(content)
            if done:
                c, more = self.tool_parser.finish()
                content, calls = content + c, calls + more
        self.reasoning += reasoning
        self.text += content
        return Delta(reasoning, content, tuple(calls))


def usage(prompt_tokens: int, choices: list[ChoiceState]) -> dict[str, Any]:
    """The prompt counts once, however many choices share it (as OpenAI counts); its cached
    tokens are the most any choice found in the prefix cache."""
    completion = sum(len(c.tokens) for c in choices)
    cached = min(prompt_tokens, max((c.cached_tokens for c in choices), default=0))
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class ResponseFormat:
    """Shared header fields; subclasses know the endpoint's object names and logprob shape."""

    object_name = ""
    chunk_object_name = ""

    def __init__(self, response_id: str, model: str, tokenizer: Any, logprobs: bool,
                 think: ThinkSetup | None = None, tools: ToolSetup | None = None) -> None:
        self.id = response_id
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs = logprobs
        self.think = think
        self.tools = tools
        self.created = int(time.time())

    def new_choice(self) -> ChoiceState:
        return ChoiceState(think=self.think, tools=self.tools)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def token_text(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.decode_bytes([token_id])
        return raw.decode("utf-8", errors="replace"), list(raw)

    def response(self, choices: list[ChoiceState], prompt_tokens: int) -> dict[str, Any]:
        return {**self._head(self.object_name),
                "choices": [self.choice(i, c, Delta(c.reasoning, c.text), c.tokens,
                                        c.reported_finish(c.finish_reason), offset=0)
                            for i, c in enumerate(choices)],
                "usage": usage(prompt_tokens, choices)}

    def chunk(self, index: int, choice: ChoiceState, out: TokenOutput, piece: Delta,
              offset: int) -> dict[str, Any]:
        """The stream chunk of token `out`, which added `piece` to `choice`."""
        return {**self._head(self.chunk_object_name),
                "choices": [self.choice(index, choice, piece, [out],
                                        choice.reported_finish(out.finish_reason), offset,
                                        delta=True)]}

    def usage_chunk(self, choices: list[ChoiceState], prompt_tokens: int) -> dict[str, Any]:
        return {**self._head(self.chunk_object_name), "choices": [],
                "usage": usage(prompt_tokens, choices)}

    def first_chunks(self, n: int) -> list[dict[str, Any]]:
        return []

    def choice(self, index: int, state: ChoiceState, text: Delta, tokens: list[TokenOutput],
               finish_reason: str | None, offset: int, delta: bool = False) -> dict[str, Any]:
        raise NotImplementedError


class ChatFormat(ResponseFormat):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def first_chunks(self, n: int) -> list[dict[str, Any]]:
        # OpenAI opens each streamed choice with the role and empty content.
        return [{**self._head(self.chunk_object_name),
                 "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}]} for i in range(n)]

    def choice(self, index: int, state: ChoiceState, text: Delta, tokens: list[TokenOutput],
               finish_reason: str | None, offset: int, delta: bool = False) -> dict[str, Any]:
        logprobs = {"content": [self._entry(t) for t in tokens], "refusal": None} \
            if self.logprobs else None
        body: dict[str, Any] = {"index": index}
        if delta:
            # DeepSeek's API (and vLLM) name the reasoning part `reasoning_content`.
            parts = {"reasoning_content": text.reasoning, "content": text.content}
            body["delta"] = {k: v for k, v in parts.items() if v}
            if text.tool_calls:
                body["delta"]["tool_calls"] = [_call_delta(d) for d in text.tool_calls]
        else:
            calls = state.tool_calls
            # OpenAI's content is null beside tool calls when the model wrote no text
            content = None if calls and not text.content.strip() else text.content
            body["message"] = {"role": "assistant", "content": content, "refusal": None}
            if state.has_reasoning:
                body["message"]["reasoning_content"] = text.reasoning
            if calls:
                body["message"]["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return {**body, "logprobs": logprobs, "finish_reason": finish_reason}

    def _entry(self, t: TokenOutput) -> dict[str, Any]:
        token, raw = self.token_text(t.token_id)
        tops = []
        for tid, lp in t.top_logprobs:
            tt, tb = self.token_text(tid)
            tops.append({"token": tt, "logprob": lp, "bytes": tb})
        return {"token": token, "logprob": t.logprob, "bytes": raw, "top_logprobs": tops}


def _call_delta(d: ToolCallDelta) -> dict[str, Any]:
    """A call's first delta names it; later ones carry pieces of its arguments."""
    if d.id is not None:
        return {"index": d.index, "id": d.id, "type": "function",
                "function": {"name": d.name, "arguments": d.arguments}}
    return {"index": d.index, "function": {"arguments": d.arguments}}


class CompletionFormat(ResponseFormat):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def choice(self, index: int, state: ChoiceState, text: Delta, tokens: list[TokenOutput],
               finish_reason: str | None, offset: int, delta: bool = False) -> dict[str, Any]:
        logprobs = None
        if self.logprobs:
            names = [self.token_text(t.token_id)[0] for t in tokens]
            offsets, pos = [], offset
            for t in tokens:
                offsets.append(pos)
                pos += len(t.text)
            logprobs = {
                "tokens": names,
                "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [{self.token_text(i)[0]: lp for i, lp in t.top_logprobs}
                                 for t in tokens],
                "text_offset": offsets,
            }
        return {"index": index, "text": text.content, "logprobs": logprobs,
                "finish_reason": finish_reason}
