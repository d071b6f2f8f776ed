"""Where a step runs each MoE layer's routed experts: on the CPU, or streamed to the GPU.

A streamed layer costs about max(copy, GPU kernels) in steady state (the copy of the next layer
overlaps this one's kernels), the same for 1 token or 8,000: its copy dominates until the kernels
catch up. The CPU's cost grows with the tokens. So each layer has a crossover token count; the
cost model measured at start-up (model_runner.calibrate_prefill) finds it, and a step of more
tokens streams the layer. Layers of the same shapes and types share one crossover; a layer of
other types scales by its bytes (both sides read the same bytes).

No torch here: this is the scheduling side's arithmetic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


def interpolate(points: tuple[tuple[int, float], ...], tokens: int) -> float:
    """Piecewise-linear in tokens through `points` (sorted by tokens); beyond the last point
    proportional to tokens (both sides' costs grow linearly with many tokens), below the first
    the first point's value (a layer's weights are read once however few the tokens)."""
    if tokens <= points[0][0]:
        return points[0][1]
    for (t0, c0), (t1, c1) in itertools.pairwise(points):
        if tokens <= t1:
            return c0 + (c1 - c0) * (tokens - t0) / (t1 - t0)
    t, c = points[-1]
    return c * tokens / t


@dataclass(frozen=True)
class PrefillCosts:
    """One reference layer's measured ms against a step's token count."""

    layer_nbytes: int  # the reference layer's expert bytes
    stream_ms: tuple[tuple[int, float], ...]  # (tokens, ms a layer streamed, steady state)
    cpu_ms: tuple[tuple[int, float], ...]  # (tokens, ms a layer on the CPU experts)

    def costs(self, tokens: int, layer_nbytes: int) -> tuple[float, float]:
        """-> (stream ms, cpu ms) for a layer of `layer_nbytes` at `tokens` tokens."""
        scale = layer_nbytes / self.layer_nbytes
        return (interpolate(self.stream_ms, tokens) * scale,
                interpolate(self.cpu_ms, tokens) * scale)

    def crossover(self) -> int | None:
        """The fewest tokens at which the reference layer streams faster (None: never up to
        the largest point measured)."""
        top = max(self.stream_ms[-1][0], self.cpu_ms[-1][0])
        lo, hi = 1, top
        stream, cpu = self.costs(hi, self.layer_nbytes)
        if stream >= cpu:
            return None
        while lo < hi:  # both sides are monotone in tokens
            mid = (lo + hi) // 2
            stream, cpu = self.costs(mid, self.layer_nbytes)
            lo, hi = (lo, mid) if stream < cpu else (mid + 1, hi)
        return lo


@dataclass(frozen=True)
class ExpertPlacement:
    """Chooses the streamed layers of a step. mode: "cpu" never streams, "stream" streams every
    layer of a step with prompt tokens, "auto" follows `costs` (None: nothing measured, as
    without a CUDA device: never streams)."""

    mode: str
    layer_nbytes: tuple[int, ...]  # each streamable layer's expert bytes
    costs: PrefillCosts | None = None

    def streamed(self, tokens: int, has_prompt: bool) -> tuple[int, ...]:
        """The layers (indices into layer_nbytes) a step of `tokens` tokens streams; decode-only
        steps never stream (their graphs hold the CPU experts' hand-over)."""
        if not has_prompt or self.mode == "cpu":
            return ()
        if self.mode == "stream":
            return tuple(range(len(self.layer_nbytes)))
        if self.costs is None:
            return ()
        return tuple(i for i, nbytes in enumerate(self.layer_nbytes)
                     if (c := self.costs.costs(tokens, nbytes))[0] < c[1])
