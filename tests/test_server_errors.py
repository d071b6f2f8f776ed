"""Malformed and hostile requests: each gets a 4xx with an OpenAI error body naming the problem,
and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_server_support import API_KEY, MAX_REQUEST_BYTES, live_server  # noqa: F401

MODEL = "tiny-v3-q4_k_m-legacy"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


def chat(**fields) -> bytes:
    return json.dumps({"model": MODEL, "messages": HI, "max_tokens": 2, **fields}).encode()


def completion(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}).encode()


# (id, method, path, body, headers, status, code, a phrase of the message)
CASES = [
    ("bad-json", "POST", CHAT, b'{"model": ', AUTH, 400, "invalid_json", "not valid JSON"),
    ("empty-body", "POST", CHAT, b"", AUTH, 400, "invalid_json", "body is empty"),
    ("json-array", "POST", CHAT, b"[1, 2]", AUTH, 400, "invalid_json", "must be a JSON object"),
    ("invalid-utf8", "POST", CHAT, b'{"model": "\xff\xfe"}', AUTH, 400, "invalid_utf8",
     "not valid UTF-8"),
    ("lone-surrogate", "POST", CHAT, chat().replace(b'"hi"', b'"\\ud800"'), AUTH, 400,
     "invalid_json", "not valid JSON"),
    ("missing-model", "POST", CHAT, json.dumps({"messages": HI}).encode(), AUTH, 400, None,
     "model: Field required"),
    ("unknown-model", "POST", CHAT, chat(model="gpt-4o"), AUTH, 404, "model_not_found",
     "'gpt-4o' does not exist"),
    ("unknown-model-completions", "POST", COMPLETIONS, completion(model="x"), AUTH, 404,
     "model_not_found", "does not exist"),
    ("empty-messages", "POST", CHAT, chat(messages=[]), AUTH, 400, None, "messages"),
    ("messages-not-list", "POST", CHAT, chat(messages="hi"), AUTH, 400, None, "messages"),
    ("unknown-role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), AUTH,
     400, None, "unknown role 'wizard'"),
    ("missing-content", "POST", CHAT, chat(messages=[{"role": "user"}]), AUTH, 400, None,
     "content is required"),
    ("image-part", "POST", CHAT, chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), AUTH, 400, "unsupported_parameter",
     "content of type 'image_url'"),
    ("tool-message", "POST", CHAT, chat(messages=[{"role": "tool", "content": "x",
                                                   "tool_call_id": "1"}]), AUTH, 400,
     "unsupported_parameter", "tool calling"),
    ("max-tokens-zero", "POST", CHAT, chat(max_tokens=0), AUTH, 400, None,
     "max_tokens must be at least 1, got 0"),
    ("max-tokens-negative", "POST", COMPLETIONS, completion(max_tokens=-5), AUTH, 400, None,
     "max_tokens must be at least 1, got -5"),
    ("max-completion-tokens-negative", "POST", CHAT, chat(max_completion_tokens=-1), AUTH, 400,
     None, "max_completion_tokens must be at least 1"),
    ("max-tokens-string", "POST", CHAT, chat(max_tokens="5"), AUTH, 400, None,
     "max_tokens: Input should be a valid integer"),
    ("max-tokens-float", "POST", CHAT, chat(max_tokens=2.5), AUTH, 400, None, "max_tokens"),
    ("temperature-string", "POST", CHAT, chat(temperature="hot"), AUTH, 400, None, "temperature"),
    ("temperature-negative", "POST", CHAT, chat(temperature=-1), AUTH, 400, None, "temperature"),
    ("top-p-zero", "POST", CHAT, chat(top_p=0), AUTH, 400, None, "top_p"),
    ("n-zero", "POST", CHAT, chat(n=0), AUTH, 400, None, "n"),
    ("n-huge", "POST", CHAT, chat(n=10**6), AUTH, 400, None, "n"),
    ("stream-string", "POST", CHAT, chat(stream="yes"), AUTH, 400, None, "stream"),
    ("stream-options-without-stream", "POST", CHAT, chat(stream_options={"include_usage": True}),
     AUTH, 400, None, "only allowed when stream is true"),
    ("empty-stop", "POST", CHAT, chat(stop=[""]), AUTH, 400, None, "stop strings must not be"),
    ("too-many-stops", "POST", CHAT, chat(stop=list("abcde")), AUTH, 400, None, "stop"),
    ("top-logprobs-without-logprobs", "POST", CHAT, chat(top_logprobs=2), AUTH, 400, None,
     "needs logprobs"),
    ("top-logprobs-huge", "POST", CHAT, chat(logprobs=True, top_logprobs=50), AUTH, 400, None,
     "top_logprobs"),
    ("completion-logprobs-huge", "POST", COMPLETIONS, completion(logprobs=6), AUTH, 400, None,
     "logprobs"),
    ("tools", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), AUTH,
     400, "unsupported_parameter", "tool calling"),
    ("tool-choice", "POST", CHAT, chat(tool_choice="auto"), AUTH, 400, "unsupported_parameter",
     "tool_choice"),
    ("response-format-json", "POST", CHAT, chat(response_format={"type": "json_object"}), AUTH,
     400, "unsupported_parameter", "response_format of type 'json_object'"),
    ("penalty", "POST", CHAT, chat(presence_penalty=0.5), AUTH, 400, "unsupported_parameter",
     "presence penalty"),
    ("unknown-field", "POST", CHAT, chat(frobnicate=1), AUTH, 400, "unknown_parameter",
     "unrecognized request argument supplied: frobnicate"),
    ("prompt-empty-list", "POST", COMPLETIONS, completion(prompt=[]), AUTH, 400, None, "prompt"),
    ("prompt-bad-token", "POST", COMPLETIONS, completion(prompt=[0, 10**9]), AUTH, 400, None,
     "outside the vocabulary"),
    ("prompt-mixed-types", "POST", COMPLETIONS, completion(prompt=[1, "a"]), AUTH, 400, None,
     "prompt"),
    ("echo", "POST", COMPLETIONS, completion(echo=True), AUTH, 400, "unsupported_parameter",
     "echo"),
    ("oversized-body", "POST", CHAT, b" " * (MAX_REQUEST_BYTES + 1), AUTH, 413,
     "request_too_large", f"limit of {MAX_REQUEST_BYTES} bytes"),
    ("oversized-10MB", "POST", CHAT, chat(messages=[{"role": "user", "content": "x" * 10**7}]),
     AUTH, 413, "request_too_large", "larger than the server's limit"),
    ("missing-api-key", "POST", CHAT, chat(), {}, 401, "invalid_api_key", "missing API key"),
    ("wrong-api-key", "POST", CHAT, chat(), {"Authorization": "Bearer nope"}, 401,
     "invalid_api_key", "incorrect API key"),
    ("models-need-key", "GET", "/v1/models", b"", {}, 401, "invalid_api_key", "API key"),
    ("unknown-route", "GET", "/v2/everything", b"", AUTH, 404, "not_found", "no route"),
    ("wrong-method", "GET", CHAT, b"", AUTH, 405, "method_not_allowed", "not allowed"),
    ("wrong-method-delete", "DELETE", "/v1/models", b"", AUTH, 405, "method_not_allowed",
     "DELETE"),
    ("unknown-model-retrieve", "GET", "/v1/models/nope", b"", AUTH, 404, "model_not_found",
     "'nope'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_request_gets_openai_error(live_server, case) -> None:  # noqa: F811
    _, method, path, body, headers, status, code, phrase = case
    r = httpx.request(method, live_server.url + path, content=body or None,
                      headers={"Content-Type": "application/json", **headers}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == code
    assert phrase in error["message"]


def test_chunked_body_over_the_cap_is_413(live_server) -> None:  # noqa: F811
    def chunks():
        for _ in range(MAX_REQUEST_BYTES // 1024 + 2):
            yield b" " * 1024

    r = httpx.post(live_server.url + CHAT, content=chunks(), headers=AUTH, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_server_keeps_serving_after_hostile_requests(live_server) -> None:  # noqa: F811
    health = httpx.get(live_server.url + "/health", timeout=10)  # open without the key
    assert health.status_code == 200 and health.json()["num_failed"] == 0
    r = httpx.post(live_server.url + CHAT, content=chat(max_tokens=3), headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
