"""Per-request sampling settings, in vLLM's vocabulary, and the check of their stop strings in
streamed text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hybrid.errors import HybridError

GREEDY_BELOW = 1e-5  # a temperature this small samples the argmax in all but name


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 (or below GREEDY_BELOW) is greedy. `top_k` <= 0, `top_p` 1 and `min_p` 0
    disable those filters (`min_p` keeps tokens at least `min_p` times as likely as the most
    likely one).
    Penalties change the scores before temperature and filters, and in greedy mode too:
    `presence_penalty` and `frequency_penalty` (OpenAI's, -2..2) subtract `presence` once and
    `frequency` per occurrence for each token generated so far; `repetition_penalty` (vLLM's
    and HF's, > 0, 1 = off) divides positive and multiplies negative logits of every token in
    the prompt or generated so far. `logprobs`: None for none, else the number of most likely
    alternatives returned beside the chosen token's own log-probability (0 = the chosen token
    only). Log-probabilities are those of the model's distribution (before penalties,
    temperature and filters), as vLLM reports them.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    # structured output: llguidance grammar text (hybrid.engine.sampling.grammar.json_grammar) the
    # output must follow; None: free text
    grammar: str | None = None
    # evaluation (not in the HTTP API): the output is these tokens in order, each decoded as a
    # sampled one would be, with the model's log-probabilities of them (teacher forcing on the
    # decode path); past them sampling goes on as set
    forced_ids: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "forced_ids", tuple(int(t) for t in self.forced_ids))
        # NOTE: written as `not (ok)` so that NaN fails every check.
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise HybridError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise HybridError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise HybridError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise HybridError(f"{name} must be between -2 and 2, got {getattr(self, name)}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise HybridError(f"repetition_penalty must be a finite number > 0 (1 = off), got "
                              f"{self.repetition_penalty}")
        if self.max_tokens < 1:
            raise HybridError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise HybridError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        if any(t < 0 for t in self.forced_ids):
            raise HybridError("forced_ids must be token ids (>= 0)")
        if any(not s for s in self.stop):
            raise HybridError("stop strings must not be empty")

    @property
    def is_greedy(self) -> bool:
        """Temperatures below GREEDY_BELOW are greedy (vLLM's rule): dividing logits by them
        would overflow float32 into a distribution of NaNs."""
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)


class StopChecker:
    """Stop strings in streamed text: hold back what could be the start of one, so none
    leaks."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was found)."""
        if not self.stops:
            return delta, False
        buf = self.pending + delta
        cut = min((buf.find(s) for s in self.stops if s in buf), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        if final:
            self.pending = ""
            return buf, False
        keep = max((_overlap(buf, s) for s in self.stops), default=0)
        self.pending = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
