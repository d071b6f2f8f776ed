"""What the HTTP layer needs of the loaded model and engine, built once at startup."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hybrid.engine.worker import EngineWorker
from server.config import ServerConfig


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
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(frozen=True)
class ServerState:
    config: ServerConfig
    model: ServedModel
    worker: EngineWorker
    # set once shutdown begins: requests get a 503 while the running ones finish (lifecycle.py)
    draining: threading.Event = field(default_factory=threading.Event)
