"""`EngineConfig`: how the serving engine runs requests (the engine layer's one frozen config)."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.errors import HybridError


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the serving engine; `hybrid serve` reads its flag defaults from here.

    `max_batch_size` is how many requests are in flight at once. In this slice each step still
    runs one forward per in-flight request, one after another (token-interleaved), so requests
    share the worker fairly but not the expert reads; batched forwards over a paged KV cache
    (continuous batching) replace that in a later slice without changing this field's meaning.
    """

    gguf_path: str | None = None  # None: the built-in demo model
    optimize_rules: str | None = None  # None: the machine's default rule file
    max_batch_size: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch_size <= 256:
            raise HybridError(f"max_batch_size must be between 1 and 256, got {self.max_batch_size}")
