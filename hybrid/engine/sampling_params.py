"""Per-request sampling settings, in vLLM's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybrid.errors import HybridError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 is greedy. `top_k` <= 0 and `top_p` 1 disable those filters. `logprobs`:
    None for none, else the number of most likely alternatives returned beside the chosen
    token's own log-probability (0 = the chosen token only). Log-probabilities are those of the
    model's distribution (before temperature and filters), as vLLM reports them.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if not self.temperature >= 0:
            raise HybridError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise HybridError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise HybridError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise HybridError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        if any(not s for s in self.stop):
            raise HybridError("stop strings must not be empty")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0
