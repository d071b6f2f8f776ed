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
    sys.path.insert(0, str(SCRIPT.parent))  # soak.py imports its sibling soak_replay.py
    spec = importlib.util.spec_from_file_location("soak", SCRIPT)
    soak = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = soak  # its dataclasses look their module up
    spec.loader.exec_module(soak)
    proc, url, _ = _start_serve(models.path("tiny-v3", "q4_k_m", vocab="deepseek"),
                                "--api-key", "k", "--max-batch-size", "4",
                                "--max-new-tokens", "200")
    try:
        result = soak.run(Namespace(url=url, api_key="k", clients=8, minutes=0.5, seed=0,
                                    pid=proc.pid, max_replays=400, tie=0.05, json=None))
        _check_diagnosis(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert result["checks"] == {name: True for name in result["checks"]}, result
    assert "rss growth <= 2%" in result["checks"]
    kinds = result["requests"]
    assert sum(kinds.values()) >= 24 and set(kinds) == {k for k, _ in soak.KINDS}
    assert result["replayed"] > 0 and not result["mismatches"]


def _check_diagnosis(url: str) -> None:
    """The diagnosis reads the server's own logprobs: a run's text follows it (gap 0); the text
    that took the second candidate at some step is that step's gap."""
    import httpx
    from soak_replay import _gap, _top_steps

    auth = {"Authorization": "Bearer k"}
    model = httpx.get(f"{url}/v1/models", headers=auth).json()["data"][0]["id"]
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Once upon a time"})):
        body = {**body, "model": model, "max_tokens": 8, "temperature": 0}
        with httpx.Client(base_url=url, headers=auth) as http:
            steps = _top_steps(http, path, body)
        text = b"".join(token for token, _ in steps)
        assert _gap(steps, text.decode("utf-8", "replace")) == 0.0 or b"\xef\xbf\xbd" in text
        # a step whose second candidate does not begin with the token taken
        i = next(i for i, (t, top) in enumerate(steps)
                 if len(top) > 1 and top[1][0] and not top[1][0].startswith(t))
        other = b"".join(t for t, _ in steps[:i]) + steps[i][1][1][0]
        try:
            text = other.decode()
        except UnicodeDecodeError:
            continue  # a candidate of partial UTF-8: no text holds it
        top = steps[i][1]
        assert abs(_gap(steps, text) - (top[0][1] - top[1][1])) < 1e-9
