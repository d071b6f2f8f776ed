"""What real OpenAI clients send and read: every documented request field accepted, log-probs
that are JSON beside grammars, and a connection that keeps serving after an error."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tests.test_server_support import API_KEY, live_server  # noqa: F401

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
          "required": ["city"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:  # noqa: F811
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=API_KEY, max_retries=0,
                         timeout=60)


def _all_finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


def test_grammar_with_logprobs_is_json_and_finite(live_server, client) -> None:  # noqa: F811
    """Masked tokens' log-probabilities are -inf: they are reported as OpenAI does (-9999.0),
    streamed and not, and the same connection serves the next request."""
    name = live_server.state.model.name
    messages = [{"role": "user", "content": "Name a city."}]
    with httpx.Client(base_url=live_server.url, headers=AUTH, timeout=60) as http:
        body = {"model": name, "messages": messages, "max_tokens": 24, "temperature": 0,
                "logprobs": True, "top_logprobs": 5, "response_format": FORMAT}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert content and _all_finite(content)
        tops = [t["logprob"] for c in content for t in c["top_logprobs"]]
        assert min(tops) >= -9999.0 and -9999.0 in tops  # masked tokens among the top 5
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data: {")]
        assert "Infinity" not in "".join(lines) and "NaN" not in "".join(lines)
        assert all(_all_finite(json.loads(ln[6:])) for ln in lines)
        again = http.post("/v1/chat/completions", json={**body, "logprobs": False,
                                                        "top_logprobs": None})
        assert again.status_code == 200
    done = client.chat.completions.create(model=name, messages=messages, max_tokens=24,
                                          temperature=0, logprobs=True, top_logprobs=2,
                                          response_format=FORMAT)
    assert json.loads(done.choices[0].message.content)["city"] is not None


@pytest.mark.parametrize("fields", [
    {"store": False, "metadata": {"run": "a"}, "service_tier": "auto", "user": "u1"},
    {"modalities": ["text"], "verbosity": "low", "prompt_cache_key": "chat-1",
     "safety_identifier": "hash-1"},
    {"web_search_options": {}, "prediction": None, "reasoning_effort": "low"},
    {"stream_options": {"include_usage": True, "include_obfuscation": False}, "stream": True},
])
def test_documented_chat_fields_are_accepted(live_server, fields: dict) -> None:  # noqa: F811
    name = live_server.state.model.name
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "temperature": 0, **fields}
    r = httpx.post(f"{live_server.url}/v1/chat/completions", json=body, headers=AUTH,
                   timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("field,value,message", [
    ("modalities", ["text", "audio"], "audio output"),
    ("audio", {"voice": "alloy", "format": "wav"}, "audio output"),
    ("frobnicate", 1, "unrecognized request argument supplied: frobnicate"),
])
def test_fields_that_cannot_be_honoured_are_400(live_server, field: str, value,  # noqa: F811
                                                message: str) -> None:
    name = live_server.state.model.name
    body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            field: value}
    r = httpx.post(f"{live_server.url}/v1/chat/completions", json=body, headers=AUTH,
                   timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_documented_completion_fields_are_accepted(live_server) -> None:  # noqa: F811
    body = {"model": live_server.state.model.name, "prompt": "Hi", "max_tokens": 2,
            "user": "u1", "stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{live_server.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text


def test_connection_serves_on_after_an_unexpected_error(live_server, monkeypatch) -> None:  # noqa: F811
    """A bug's 500 must not cost the client its keep-alive connection (Starlette re-raises
    after its 500 and uvicorn then closes the connection: the next request was reset)."""
    import server.routes

    real = server.routes.chat_prompt
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(server.routes, "chat_prompt", fails_once)
    body = {"model": live_server.state.model.name, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.Client(base_url=live_server.url, headers=AUTH, timeout=60) as http:
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 500
        assert r.json()["error"] == {"message": "internal error: RuntimeError",
                                     "type": "server_error", "param": None,
                                     "code": "internal_error"}
        assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_reasoning_effort_none_turns_forced_thinking_off(live_server) -> None:  # noqa: F811
    """Under --force-think a chat prompt ends with "<think>\\n"; reasoning_effort "none" or
    "minimal" leaves it out (no reasoning), the other efforts keep it."""
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from server.app import create_app

    state = live_server.state
    app = create_app(replace(state, config=replace(state.config, force_think=True)))
    tok = state.model.tokenizer
    plain = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": "Why?"}]),
                           add_bos=False))
    body = {"model": state.model.name, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "Why?"}]}
    with TestClient(app, headers=AUTH) as http:
        counts = {effort: http.post("/v1/chat/completions", json={
            **body, "reasoning_effort": effort}).json()["usage"]["prompt_tokens"]
            for effort in ("none", "minimal", "low", "high")}
        bad = http.post("/v1/chat/completions", json={**body, "reasoning_effort": "max"})
    assert counts["none"] == counts["minimal"] == plain
    assert counts["low"] == counts["high"] > plain  # "<think>\n" appended
    assert bad.status_code == 400 and "reasoning_effort must be one of" in bad.text


def test_a_failing_step_ends_its_requests_with_a_500_naming_it_and_serving_goes_on(
        live_server, monkeypatch) -> None:  # noqa: F811
    runner = live_server.state.worker.engine.runner
    real, calls = runner.run, []

    def fails_once(batch, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected kernel fault")
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(runner, "run", fails_once)
    body = {"model": live_server.state.model.name, "prompt": [1, 2, 3], "max_tokens": 3}
    with httpx.Client(base_url=live_server.url, headers=AUTH, timeout=60) as http:
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 500
        error = r.json()["error"]
        assert error["code"] == "generation_failed"
        assert error["message"] == "generation failed: RuntimeError: injected kernel fault"
        again = http.post("/v1/completions", json=body)
        assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 3
    health = live_server.wait_idle()
    assert health["num_failed"] >= 1 and health["kv_pages_used"] == 0
