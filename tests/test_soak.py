"""The soak run's CPU form: 8 clients of mixed traffic for half a minute against `hybrid serve`
started as a process (the tiny model, max 4 requests a batch), then its checks: no 5xx, no
cross-talk, pages back, counters, the server's memory."""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
from argparse import Namespace
from pathlib import Path

from tests.test_served_path import _start_serve

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "soak.py"


def test_soak_cpu_form(models, tmp_path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))  # soak.py imports its sibling soak_replay.py
    spec = importlib.util.spec_from_file_location("soak", SCRIPT)
    soak = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = soak  # its dataclasses look their module up
    spec.loader.exec_module(soak)
    proc, url, _ = _start_serve(models.path("tiny-v3", "q4_k_m", vocab="deepseek"),
                                "--api-key", "k", "--max-batch-size", "4",
                                "--max-new-tokens", "200", "--trace-steps",
                                str(tmp_path / "steps.jsonl"))
    try:
        result = soak.run(Namespace(url=url, api_key="k", clients=8, minutes=0.5, seed=0,
                                    pid=proc.pid, max_replays=400, tie=0.05, json=None))
        _check_diagnosis(url)
        _check_trace(url, tmp_path / "steps.jsonl")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert result["checks"] == {name: True for name in result["checks"]}, result
    assert "rss growth <= 2%" in result["checks"]
    kinds = result["requests"]
    assert sum(kinds.values()) >= 24 and set(kinds) == {k for k, _ in soak.KINDS}
    assert result["replayed"] > 0 and not result["mismatches"]


def _check_trace(url: str, trace: Path) -> None:
    """`--trace-steps` wrote a line a step, every sampled token in one; a response's tokens are
    found in it by the response's id."""
    import httpx
    from soak_replay import steps_of

    def sampled() -> int:
        return sum(len(json.loads(line)["sampled"]) for line in trace.read_text().splitlines())

    auth = {"Authorization": "Bearer k"}
    with httpx.Client(base_url=url, headers=auth) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "Trace me", "max_tokens": 5, "temperature": 0,
                "ignore_eos": True, "logprobs": 1}
        traced, generated = sampled(), http.get("/health").json()["num_generated_tokens"]
        response = http.post("/v1/completions", json=body).json()
        assert http.get("/health").json()["num_generated_tokens"] - generated == 5
    assert sampled() - traced == 5
    steps = steps_of(str(trace), response["id"])
    tokens = [s["token"] for s in steps if s["token"] is not None]
    assert len(tokens) == 5  # the prompt's last chunk's step, then 4 decodes
    assert steps[0]["own"][0][1] == 0  # its first chunk starts the prompt
    assert all(s["own"][0][3] for s in steps if s["token"] is not None)  # chunks that sample


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
