"""Build OpenAI response objects (chat and completions, whole and streamed) from token events."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from hybrid.engine.request import TokenOutput
from server.reasoning import ReasoningParser, ThinkSetup


@dataclass(frozen=True)
class Delta:
    """What one token adds to a choice: reasoning (inside <think>) and answer text."""

    reasoning: str = ""
    content: str = ""


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

    def __post_init__(self) -> None:
        if self.think is not None and self.parser is None:
            self.parser = self.think.parser()

    @property
    def has_reasoning(self) -> bool:
        return self.parser is not None and self.parser.saw_think

    def add(self, out: TokenOutput) -> Delta:
        self.tokens.append(out)
        self.cached_tokens = out.cached_tokens
        self.finish_reason = out.finish_reason or self.finish_reason
        if self.parser is None or self.think is None:
            self.text += out.text
            return Delta(content=out.text)
        reasoning, content = self.parser.feed(self.think.text_of(out.token_id, out.text))
        if out.finish_reason is not None:
            r, c = self.parser.finish()
            reasoning, content = reasoning + r, content + c
        self.reasoning += reasoning
        self.text += content
        return Delta(reasoning, content)


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
                 think: ThinkSetup | None = None) -> None:
        self.id = response_id
        self.model = model
        self.tokenizer = tokenizer
        self.logprobs = logprobs
        self.think = think
        self.created = int(time.time())

    def new_choice(self) -> ChoiceState:
        return ChoiceState(think=self.think)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def token_text(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.decode_bytes([token_id])
        return raw.decode("utf-8", errors="replace"), list(raw)

    def response(self, choices: list[ChoiceState], prompt_tokens: int) -> dict[str, Any]:
        return {**self._head(self.object_name),
                "choices": [self.choice(i, c, Delta(c.reasoning, c.text), c.tokens,
                                        c.finish_reason, offset=0) for i, c in enumerate(choices)],
                "usage": usage(prompt_tokens, choices)}

    def chunk(self, index: int, choice: ChoiceState, out: TokenOutput, piece: Delta,
              offset: int) -> dict[str, Any]:
        """The stream chunk of token `out`, which added `piece` to `choice`."""
        return {**self._head(self.chunk_object_name),
                "choices": [self.choice(index, choice, piece, [out], out.finish_reason, offset,
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
        else:
            body["message"] = {"role": "assistant", "content": text.content, "refusal": None}
            if state.has_reasoning:
                body["message"]["reasoning_content"] = text.reasoning
        return {**body, "logprobs": logprobs, "finish_reason": finish_reason}

    def _entry(self, t: TokenOutput) -> dict[str, Any]:
        token, raw = self.token_text(t.token_id)
        tops = []
        for tid, lp in t.top_logprobs:
            tt, tb = self.token_text(tid)
            tops.append({"token": tt, "logprob": lp, "bytes": tb})
        return {"token": token, "logprob": t.logprob, "bytes": raw, "top_logprobs": tops}


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
