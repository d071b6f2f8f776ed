"""Progress of long start-up work (loading, writing a model) on stderr, for the CLI."""

from __future__ import annotations

import sys
from collections.abc import Callable


def progress_bar(desc: str, unit: str = "B") -> Callable[[int, int], None]:
    """Progress of (done, total) calls on stderr; bytes show as GB and GB/s. On a terminal a
    tqdm bar (its rate averaged over the whole run: a first cached chunk read in microseconds
    showed 23 TB/s); in a log or pipe one line when it starts and one when it ends."""
    if not sys.stderr.isatty():
        return _progress_lines(desc, unit)
    from tqdm import tqdm

    bar: dict[str, tqdm] = {}

    def update(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B",
                              unit_divisor=1000, file=sys.stderr, leave=False, smoothing=0)
        bar["bar"].total, bar["bar"].n = total, done
        bar["bar"].refresh()
        if done >= total:
            bar["bar"].close()

    return update


def _progress_lines(desc: str, unit: str) -> Callable[[int, int], None]:
    import time

    start: list[float] = []

    def amount(n: int) -> str:
        if unit == "B":
            return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
        return f"{n} {unit}{'s' if n != 1 else ''}"

    def update(done: int, total: int) -> None:
        if not start:
            start.append(time.perf_counter())
            print(f"{desc}: {amount(total)} ...", file=sys.stderr, flush=True)
        if done >= total and len(start) == 1:
            seconds = time.perf_counter() - start[0]
            start.append(seconds)
            rate = f", {total / 1e9 / seconds:.2f} GB/s" if unit == "B" and seconds > 0 else ""
            print(f"{desc}: {amount(total)} in {seconds:.1f} s{rate}", file=sys.stderr,
                  flush=True)

    return update
