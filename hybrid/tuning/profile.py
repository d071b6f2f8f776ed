"""A routing profile: how often each MoE layer's router chose each expert, prompt tokens and
decode tokens counted apart, over some traffic (`hybrid profile`, `hybrid serve
--record-routing`). JSON, one object:

    {"format": "hybrid-routing-profile", "version": 1, "model": "<file name>",
     "num_experts": E, "experts_per_token": K, "layers": [model layer indices],
     "tokens": {"prefill": n, "decode": m},
     "prefill": [[count per expert] per layer], "decode": [[...] per layer]}

Each token adds K choices to each layer's row, so a row sums to K times the tokens counted.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hybrid.errors import HybridError

FORMAT, VERSION = "hybrid-routing-profile", 1


@dataclass(frozen=True)
class RoutingProfile:
    model: str
    num_experts: int
    experts_per_token: int
    layers: tuple[int, ...]
    prefill_tokens: int
    decode_tokens: int
    prefill: np.ndarray  # [L, E] int64
    decode: np.ndarray  # [L, E] int64

    @classmethod
    def from_counts(cls, model: str, experts_per_token: int, layers: list[int],
                    counts: list, tokens: list[int]) -> RoutingProfile:
        """From RoutingRecorder.snapshot()'s (counts [phase][layer][expert], tokens [phase])."""
        c = np.asarray(counts, np.int64)
        return cls(model, c.shape[2], experts_per_token, tuple(layers), int(tokens[0]),
                   int(tokens[1]), c[0], c[1])

    @classmethod
    def of_engine(cls, engine, model: str) -> RoutingProfile:
        """What an engine built with `record_routing` has recorded so far."""
        recorded = engine.routing_counts()
        if recorded is None:
            raise HybridError("the engine does not record routing: build it with "
                              "EngineConfig(record_routing=True)")
        counts, tokens, layers = recorded
        return cls.from_counts(model, engine.spec.num_experts_per_tok, layers, counts, tokens)

    def frequencies(self, phase: str = "decode") -> np.ndarray:
        """[L, E]: the share of `phase`'s tokens that chose each expert (0..1); with no tokens
        of that phase, all phases together."""
        counts, tokens = {"decode": (self.decode, self.decode_tokens),
                          "prefill": (self.prefill, self.prefill_tokens)}[phase]
        if tokens == 0:
            counts, tokens = self.prefill + self.decode, self.prefill_tokens + self.decode_tokens
        return counts / max(tokens, 1)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "model": self.model,
                "num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
                "layers": list(self.layers),
                "tokens": {"prefill": self.prefill_tokens, "decode": self.decode_tokens},
                "prefill": self.prefill.tolist(), "decode": self.decode.tolist()}

    def save(self, path: str | Path) -> None:
        """Write atomically: a reader (or a crash) never sees half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_json(), f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> RoutingProfile:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise HybridError(f"cannot read the routing profile {path}: {e.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HybridError(f"{path} is not a routing profile (not JSON: {e})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def from_json(cls, data: object, where: str = "the profile") -> RoutingProfile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise HybridError(f"{where} is not a routing profile (write one with `hybrid "
                              "profile` or `hybrid serve --record-routing`)")
        if data.get("version") != VERSION:
            raise HybridError(f"{where} is a version {data.get('version')!r} profile; this "
                              f"hybrid reads version {VERSION}")
        try:
            layers = tuple(int(x) for x in data["layers"])
            prefill = np.asarray(data["prefill"], np.int64)
            decode = np.asarray(data["decode"], np.int64)
            e, k = int(data["num_experts"]), int(data["experts_per_token"])
            tokens = data["tokens"]
            p = cls(str(data["model"]), e, k, layers, int(tokens["prefill"]),
                    int(tokens["decode"]), prefill, decode)
        except (KeyError, TypeError, ValueError) as e:
            raise HybridError(f"{where} is malformed: {type(e).__name__} {e}") from None
        if prefill.shape != (len(layers), e) or decode.shape != prefill.shape:
            raise HybridError(f"{where} is malformed: counts of shape {prefill.shape} and "
                              f"{decode.shape}, expected {(len(layers), e)}")
        if (prefill < 0).any() or (decode < 0).any():
            raise HybridError(f"{where} is malformed: negative counts")
        return p
