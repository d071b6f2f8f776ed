"""Malformed and hostile requests: each gets a 4xx with an OpenAI error body naming the problem
(an Ollama one, `{"error": "..."}`, on the Ollama routes), and the server keeps serving."""

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
    ("user-tool-calls", "POST", CHAT, chat(messages=[{"role": "user", "content": "x",
                                                      "tool_calls": []}]), AUTH, 400, None,
     "only assistant messages make tool calls"),
    ("tool-call-shape", "POST", CHAT, chat(messages=[{"role": "assistant", "content": None,
                                                      "tool_calls": [{"id": "1"}]}]), AUTH, 400,
     None, "messages.0.tool_calls.0: a tool call is"),
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
    ("tool-name", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f g"}}]),
     AUTH, 400, None, "tools.0.function.name must be 1-64 letters"),
    ("tool-choice-without-tools", "POST", CHAT, chat(tool_choice="auto"), AUTH, 400, None,
     "tool_choice is only allowed when tools are specified"),
    ("response-format-xml", "POST", CHAT, chat(response_format={"type": "xml"}), AUTH,
     400, "unsupported_parameter", "response_format of type 'xml'"),
    ("response-format-bad-schema", "POST", CHAT, chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "(["}}}}}),
     AUTH, 400, None, "the JSON schema cannot be used: regex parse error"),
    ("response-format-no-schema", "POST", CHAT, chat(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": "nope"}}), AUTH, 400, None,
     "needs a json_schema object with a 'schema' object"),
    ("presence-penalty-high", "POST", CHAT, chat(presence_penalty=2.5), AUTH, 400, None,
     "presence_penalty: Input should be less than or equal to 2"),
    ("frequency-penalty-low", "POST", COMPLETIONS, completion(frequency_penalty=-3), AUTH, 400,
     None, "frequency_penalty: Input should be greater than or equal to -2"),
    ("frequency-penalty-string", "POST", CHAT, chat(frequency_penalty="lots"), AUTH, 400, None,
     "frequency_penalty"),
    ("presence-penalty-overflow", "POST", CHAT, chat().replace(b'"max_tokens"',
     b'"presence_penalty": 1e999, "max_tokens"'), AUTH, 400, None, "presence_penalty"),
    ("repetition-penalty-zero", "POST", CHAT, chat(repetition_penalty=0), AUTH, 400, None,
     "repetition_penalty: Input should be greater than 0"),
    ("repetition-penalty-negative", "POST", COMPLETIONS, completion(repetition_penalty=-1.5),
     AUTH, 400, None, "repetition_penalty"),
    ("repetition-penalty-nan", "POST", CHAT, chat().replace(b'"max_tokens"',
     b'"repetition_penalty": NaN, "max_tokens"'), AUTH, 400, None,
     "repetition_penalty: Input should be a finite number"),
    ("min-p-high", "POST", CHAT, chat(min_p=1.5), AUTH, 400, None,
     "min_p: Input should be less than or equal to 1"),
    ("min-p-negative", "POST", COMPLETIONS, completion(min_p=-0.1), AUTH, 400, None, "min_p"),
    ("min-p-string", "POST", CHAT, chat(min_p="0.1"), AUTH, 400, None, "min_p"),
    ("top-k-below-minus-one", "POST", CHAT, chat(top_k=-2), AUTH, 400, None, "top_k"),
    ("logit-bias", "POST", CHAT, chat(logit_bias={"1": 5}), AUTH, 400, "unsupported_parameter",
     "logit_bias"),
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
    ("metrics-need-key", "GET", "/metrics", b"", {}, 401, "invalid_api_key", "missing API key"),
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


OLLAMA_CHAT, OLLAMA_GENERATE = "/api/chat", "/api/generate"


def ollama_chat(**fields) -> bytes:
    return json.dumps({"model": MODEL, "messages": HI, "stream": False,
                       "options": {"num_predict": 2}, **fields}).encode()


def ollama_generate(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", "stream": False,
                       "options": {"num_predict": 2}, **fields}).encode()


# (id, method, path, body, headers, status, a phrase of the message)
OLLAMA_CASES = [
    ("bad-json", "POST", OLLAMA_CHAT, b'{"model": ', AUTH, 400, "not valid JSON"),
    ("empty-body", "POST", OLLAMA_GENERATE, b"", AUTH, 400, "body is empty"),
    ("invalid-utf8", "POST", OLLAMA_CHAT, b'{"model": "\xff"}', AUTH, 400, "not valid UTF-8"),
    ("json-array", "POST", OLLAMA_CHAT, b"[]", AUTH, 400, "must be a JSON object"),
    ("missing-model", "POST", OLLAMA_CHAT, json.dumps({"messages": HI}).encode(), AUTH, 400,
     "model: Field required"),
    ("unknown-model", "POST", OLLAMA_CHAT, ollama_chat(model="llama3"), AUTH, 404,
     "model 'llama3' not found"),
    ("unknown-model-generate", "POST", OLLAMA_GENERATE, ollama_generate(model="x:7b"), AUTH,
     404, "not found"),
    ("messages-not-list", "POST", OLLAMA_CHAT, ollama_chat(messages="hi"), AUTH, 400,
     "messages"),
    ("unknown-role", "POST", OLLAMA_CHAT, ollama_chat(messages=[{"role": "wizard",
                                                                 "content": "x"}]), AUTH, 400,
     "unknown role 'wizard'"),
    ("user-tool-calls", "POST", OLLAMA_CHAT, ollama_chat(messages=[
        {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]), AUTH,
     400, "only assistant messages make tool calls"),
    ("images", "POST", OLLAMA_CHAT, ollama_chat(messages=[{"role": "user", "content": "x",
                                                           "images": ["aGk="]}]), AUTH, 400,
     "images is not supported"),
    ("tools", "POST", OLLAMA_CHAT, ollama_chat(tools=[{"type": "function"}]), AUTH, 400,
     "tools.0: a tool is"),
    ("format-yaml", "POST", OLLAMA_GENERATE, ollama_generate(format="yaml"), AUTH, 400,
     'format must be \"json\" or a JSON schema object'),
    ("stream-string", "POST", OLLAMA_CHAT, ollama_chat(stream="yes"), AUTH, 400, "stream"),
    ("options-not-object", "POST", OLLAMA_CHAT, ollama_chat(options=[1]), AUTH, 400, "options"),
    ("unknown-option", "POST", OLLAMA_CHAT, ollama_chat(options={"mirostat": 2}), AUTH, 400,
     "unrecognized request argument supplied: options.mirostat"),
    ("unknown-field", "POST", OLLAMA_GENERATE, ollama_generate(frobnicate=1), AUTH, 400,
     "frobnicate"),
    ("num-predict-zero", "POST", OLLAMA_CHAT, ollama_chat(options={"num_predict": 0}), AUTH, 400,
     "num_predict must be at least 1"),
    ("num-predict-string", "POST", OLLAMA_GENERATE, ollama_generate(options={"num_predict": "5"}),
     AUTH, 400, "num_predict"),
    ("temperature-negative", "POST", OLLAMA_CHAT, ollama_chat(options={"temperature": -1}), AUTH,
     400, "temperature"),
    ("repeat-penalty-zero", "POST", OLLAMA_GENERATE, ollama_generate(options={"repeat_penalty": 0}),
     AUTH, 400, "options.repeat_penalty: Input should be greater than 0"),
    ("presence-penalty-high", "POST", OLLAMA_CHAT, ollama_chat(options={"presence_penalty": 5}),
     AUTH, 400, "presence_penalty"),
    ("frequency-penalty-low", "POST", OLLAMA_CHAT, ollama_chat(options={"frequency_penalty": -9}),
     AUTH, 400, "frequency_penalty"),
    ("min-p-high", "POST", OLLAMA_GENERATE, ollama_generate(options={"min_p": 2}), AUTH, 400,
     "min_p"),
    ("too-many-stops", "POST", OLLAMA_CHAT, ollama_chat(options={"stop": list("abcde")}), AUTH,
     400, "stop"),
    ("suffix", "POST", OLLAMA_GENERATE, ollama_generate(suffix="x"), AUTH, 400,
     "suffix is not supported"),
    ("context", "POST", OLLAMA_GENERATE, ollama_generate(context=[1, 2]), AUTH, 400, "context"),
    ("raw-with-system", "POST", OLLAMA_GENERATE, ollama_generate(raw=True, system="x"), AUTH, 400,
     "system has no effect with raw"),
    ("show-unknown-model", "POST", "/api/show", json.dumps({"model": "nope"}).encode(), AUTH, 404,
     "'nope' not found"),
    ("show-no-model", "POST", "/api/show", b"{}", AUTH, 400, "model: Field required"),
    ("missing-api-key", "POST", OLLAMA_CHAT, ollama_chat(), {}, 401, "missing API key"),
    ("wrong-api-key", "GET", "/api/tags", b"", {"Authorization": "Bearer nope"}, 401,
     "incorrect API key"),
    ("oversized-body", "POST", OLLAMA_CHAT, b" " * (MAX_REQUEST_BYTES + 1), AUTH, 413,
     f"limit of {MAX_REQUEST_BYTES} bytes"),
    ("unknown-route", "POST", "/api/pull", b"{}", AUTH, 404, "no route POST /api/pull"),
    ("wrong-method", "GET", OLLAMA_CHAT, b"", AUTH, 405, "not allowed"),
]


@pytest.mark.parametrize("case", OLLAMA_CASES, ids=[c[0] for c in OLLAMA_CASES])
def test_hostile_ollama_request_gets_ollama_error(live_server, case) -> None:  # noqa: F811
    _, method, path, body, headers, status, phrase = case
    r = httpx.request(method, live_server.url + path, content=body or None,
                      headers={"Content-Type": "application/json", **headers}, timeout=30)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and phrase in r.json()["error"], r.text


def test_there_are_enough_hostile_cases() -> None:
    assert len(CASES) >= 40 and len(OLLAMA_CASES) >= 30


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
    r = httpx.post(live_server.url + OLLAMA_CHAT, content=ollama_chat(), headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["done"] is True and r.json()["eval_count"] <= 2
