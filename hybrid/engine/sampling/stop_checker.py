"""Stop strings in streamed text: hold back what could be the start of one, so none leaks."""

from __future__ import annotations

from collections.abc import Sequence


class StopChecker:
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
