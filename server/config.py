"""`ServerConfig`: the server layer's one frozen config; `hybrid serve` reads flag defaults here."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hybrid.engine.config import EngineConfig
from hybrid.errors import HybridError

MAX_REQUEST_BYTES = 1 << 20  # 1 MiB: far above any chat a 2-core box can serve, far below abuse


@dataclass(frozen=True)
class ServerConfig:
    """How `hybrid serve` listens and what it allows per request.

    `max_new_tokens` caps every request: a larger `max_tokens` is clamped to it (and then ends
    with finish_reason "length"); a request without `max_tokens` gets the cap.
    `api_key` None leaves the API open; otherwise every route but /health needs
    `Authorization: Bearer <api_key>`. `served_model_name` None uses the GGUF file's stem.
    `force_think` ends every chat prompt with "<think>\n" (DeepSeek R1's convention), so the
    model reasons first; chat responses then split reasoning from the answer.
    `chat_template` (a bundled family's name or a .jinja file) replaces the file's template:
    for files converted without one, or with an older revision (V3's first template writes
    earlier tool calls only for content None; R1's handles both).
    `routing_profile` records which experts the traffic's routers choose into that file
    (rewritten every 30 s and at shutdown), for `hybrid tune`.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    max_new_tokens: int = 2048
    api_key: str | None = None
    served_model_name: str | None = None
    max_request_bytes: int = MAX_REQUEST_BYTES
    log_level: str = "info"
    force_think: bool = False
    chat_template: str | None = None
    routing_profile: str | None = None  # --record-routing: the live profile's file
    # JSON schemas (response_format, tool parameters) read as JSON Schema does: objects take
    # keys their properties do not list unless the schema says no (default: they take none)
    lenient_schemas: bool = False
    # on SIGTERM/SIGINT: seconds the running requests may take to finish before they are
    # cancelled (new ones get a 503 meanwhile; server/lifecycle.py)
    shutdown_timeout: float = 30.0

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
        if self.log_level not in LOG_LEVELS:
            raise HybridError(f"log_level must be one of {', '.join(LOG_LEVELS)}, "
                              f"got {self.log_level!r}")

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


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
