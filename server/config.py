"""`ServerConfig`: the server layer's one frozen config; `hybrid serve` reads flag defaults here."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hybrid.engine.config import EngineConfig
from hybrid.errors import HybridError
from hybrid.settings import check_choices, setting
from hybrid.tokenizer.bundled_templates import BUNDLED_TEMPLATES

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MAX_REQUEST_BYTES = 1 << 20  # 1 MiB: far above any chat a 2-core box can serve, far below abuse


@dataclass(frozen=True)
class ServerConfig:
    """How `hybrid serve` listens and what it allows per request, each setting declared once
    with the help its flag shows (hybrid/settings.py).

    `max_new_tokens` caps every request: a larger `max_tokens` is clamped to it (and then ends
    with finish_reason "length"); a request without `max_tokens` gets the cap. `force_think`
    makes chat responses split reasoning from the answer. `chat_template` exists for files
    converted without a template, or with an older revision (V3's first template writes
    earlier tool calls only for content None; R1's handles both).
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = setting("127.0.0.1", help="address to listen on (0.0.0.0: all)")
    port: int = setting(8000, help="TCP port to listen on (0: any free port, printed at start)")
    max_new_tokens: int = setting(
        2048, help="cap on tokens per request; larger max_tokens are clamped to it")
    api_key: str | None = setting(
        None, help="require 'Authorization: Bearer KEY' on every route but /health")
    served_model_name: str | None = setting(
        None, help="the model name clients pass (default: the GGUF file's stem)")
    max_request_bytes: int = setting(MAX_REQUEST_BYTES, help="larger request bodies get a 413")
    log_level: str = setting("info", choices=LOG_LEVELS,
                             help="the server's and the engine's log level")
    force_think: bool = setting(
        False, help="end chat prompts with '<think>\\n' (DeepSeek R1): the model reasons first; "
                    "chat replies carry it apart (reasoning_content)")
    chat_template: str | None = setting(
        None, metavar="NAME|FILE",
        help="replace the file's chat template with a bundled family's ("
             + ", ".join(BUNDLED_TEMPLATES) + ") or a .jinja file")
    lenient_schemas: bool = setting(
        False, help="let structured output and tool calls write object keys their JSON schema "
                    "does not list where it does not forbid them (as JSON Schema reads it); by "
                    "default they write none, as vLLM and SGLang do")
    shutdown_timeout: float = setting(
        30.0, metavar="S",
        help="on SIGTERM or Ctrl-C: new requests get a 503 while the running ones have S "
             "seconds to finish; then they are cancelled (server/lifecycle.py)")
    routing_profile: str | None = setting(
        None, flag="--record-routing", metavar="FILE",
        help="record which experts the traffic uses into FILE (a routing profile for `hybrid "
             "tune`, rewritten every 30 s and at shutdown)")
    trace_steps: str | None = setting(
        None, metavar="FILE",
        help="write one JSON line a step to FILE: its requests' chunks and sampled tokens "
             "(hybrid/engine/step_trace.py; for tracing a wrong answer to its step)")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise HybridError(f"port must be between 0 and 65535, got {self.port}")
        if not self.host:
            raise HybridError("host must not be empty (use 127.0.0.1, or 0.0.0.0 for all)")
        if self.max_new_tokens < 1:
            raise HybridError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.api_key is not None and not self.api_key.strip():
            raise HybridError("api_key must not be empty (leave it out to serve without one)")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise HybridError("served_model_name must not be empty")
        if self.max_request_bytes < 1024:
            raise HybridError(f"max_request_bytes must be at least 1024, got "
                              f"{self.max_request_bytes}")
        if not self.shutdown_timeout >= 0:
            raise HybridError(f"shutdown_timeout must be >= 0 seconds, got "
                              f"{self.shutdown_timeout}")
        check_choices(self)

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> ServerConfig:
        """Build from one flat mapping of server and engine field names; unknown keys are errors."""
        engine_keys = {f.name for f in fields(EngineConfig)}
        server_keys = {f.name for f in fields(cls)} - {"engine"}
        unknown = sorted(set(values) - engine_keys - server_keys)
        if unknown:
            raise HybridError(f"unknown server setting(s): {', '.join(unknown)}")
        engine_values = {k: v for k, v in values.items() if k in engine_keys}
        if values.get("routing_profile"):
            engine_values["record_routing"] = True
        engine = EngineConfig(**engine_values)
        return cls(engine=engine, **{k: v for k, v in values.items() if k in server_keys})

