"""`hybrid serve --trace-steps FILE`: one JSON line a step, to trace a wrong answer back to the
step that sampled it and what else ran in that step.

A line: {"step": n, "t": seconds since the trace began, "ms": the step's time, "chunks":
[[request id, first position, tokens, samples], ...] (decodes first, as scheduled),
"in_flight": the request ids whose prompt chunk is passing the layers over steps after this
one (layered_prefill.py; at most one), "sampled": [[request id, token id (null: the request
failed in this step)], ...]}. Request ids are the
engine's (an API response's id, then "-" and the choice's index). Lines are written as steps
end (line-buffered: a crashed server keeps what it wrote). Imports no torch.
"""

from __future__ import annotations

import json
import time

from hybrid.errors import HybridError


class StepTrace:
    def __init__(self, path: str) -> None:
        try:
            self._file = open(path, "w", buffering=1)  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise HybridError(f"--trace-steps {path}: cannot write it ({e.strerror}); give a "
                              f"path in a writable folder") from None
        self._start = time.perf_counter()
        self._steps = 0

    def write(self, batch, in_flight, outputs, seconds: float) -> None:
        """batch: the step's ScheduledBatch; in_flight: the Requests whose chunk is in flight
        after it; outputs: its StepOutputs."""
        self._steps += 1
        line = {"step": self._steps, "t": round(time.perf_counter() - self._start, 4),
                "ms": round(seconds * 1e3, 2),
                "chunks": [[c.request.request_id, c.start, len(c.token_ids), c.samples]
                           for c in batch.chunks],
                "in_flight": [r.request_id for r in in_flight],
                "sampled": [[o.request.request_id, getattr(o.token, "token_id", None)]
                            for o in outputs]}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()
