"""What the HTTP layer needs of the loaded model and engine, built once at startup."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hybrid.engine.worker import EngineWorker
from server.config import ServerConfig
from server.reasoning import is_thinking_template, think_tags
from server.tools.formats import ToolFormat
from server.tools.setup import model_format


@dataclass(frozen=True)
class ChatTraits:
    """What the model's chat template and vocabulary say about its replies, read once at
    startup rather than per request."""

    tool_format: ToolFormat  # how it writes tool calls (tools/formats.py)
    thinking_template: bool  # its template opens a reasoning block (reasoning.py)
    think_tags: dict[int, str]  # its <think> and </think> control tokens: id -> text

    @classmethod
    def of(cls, tokenizer: Any) -> ChatTraits:
        return cls(model_format(tokenizer), is_thinking_template(tokenizer.chat_template.source),
                   think_tags(tokenizer))


@dataclass(frozen=True)
class ServedModel:
    """The one model this server serves. Values found at startup live here, not in the config."""

    name: str  # what clients pass as "model"
    tokenizer: Any  # hybrid.tokenizer.gguf_tokenizer.GGUFTokenizer
    vocab_size: int
    context_length: int  # the model's own (GGUF metadata)
    eos_token_id: int | None
    # The most tokens (prompt + output) one request may hold: the context, or less when the
    # KV cache (--cache-lens) is smaller.
    max_request_tokens: int
    chat: ChatTraits
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(frozen=True)
class ServerState:
    config: ServerConfig
    model: ServedModel
    worker: EngineWorker
    # set once shutdown begins: requests get a 503 while the running ones finish (lifecycle.py)
    draining: threading.Event = field(default_factory=threading.Event)
