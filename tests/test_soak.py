"""The soak run's CPU form: 8 clients of mixed traffic for half a minute against `hybrid serve`
started as a process (the tiny model, max 4 requests a batch), then its checks: no 5xx, no
cross-talk, pages back, counters, the server's memory."""

from __future__ import annotations

import importlib.util
import signal
import sys
from argparse import Namespace
from pathlib import Path

from tests.test_served_path import _start_serve

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "soak.py"


def test_soak_cpu_form(models) -> None:
    spec = importlib.util.spec_from_file_location("soak", SCRIPT)
    soak = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = soak  # its dataclasses look their module up
    spec.loader.exec_module(soak)
    proc, url, _ = _start_serve(models.path("tiny-v3", "q4_k_m", vocab="deepseek"),
                                "--api-key", "k", "--max-batch-size", "4",
                                "--max-new-tokens", "200")
    try:
        result = soak.run(Namespace(url=url, api_key="k", clients=8, minutes=0.5, seed=0,
                                    pid=proc.pid, max_replays=400, json=None))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert result["checks"] == {name: True for name in result["checks"]}, result
    assert "rss growth <= 2%" in result["checks"]
    kinds = result["requests"]
    assert sum(kinds.values()) >= 24 and set(kinds) == {k for k, _ in soak.KINDS}
    assert result["replayed"] > 0 and not result["mismatches"]
