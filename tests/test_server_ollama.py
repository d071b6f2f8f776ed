"""The Ollama API against the live server with httpx: /api/chat and /api/generate (NDJSON
streams and single objects) give what the OpenAI routes give for the same prompt and sampling,
with Ollama's counts and durations; /api/tags, /api/show, /api/version; cancel on disconnect."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.test_server_support import API_KEY, live_server  # noqa: F401

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def api(live_server) -> httpx.Client:  # noqa: F811
    with httpx.Client(base_url=live_server.url, headers=AUTH, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def model(live_server) -> str:  # noqa: F811
    return live_server.state.model.name


def ndjson(response: httpx.Response) -> list[dict]:
    assert response.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in response.text.splitlines()]


def test_version_tags_and_show(api: httpx.Client, model: str, live_server) -> None:  # noqa: F811
    assert api.get("/api/version").json()["version"] == "0.1.0"
    (entry,) = api.get("/api/tags").json()["models"]
    assert entry["name"] == entry["model"] == model and entry["details"]["format"] == "gguf"
    assert entry["size"] > 0 and len(entry["digest"]) == 64
    for key in ("model", "name"):
        show = api.post("/api/show", json={key: f"{model}:latest"}).json()
        assert show["template"] == live_server.state.model.tokenizer.chat_template.source
        assert show["model_info"]["deepseek2.context_length"] == live_server.state.model \
            .context_length
        assert show["capabilities"] == ["completion", "tools"]  # the V3 template does not think


def test_chat_equals_openai_chat_whole_and_streamed(api: httpx.Client, model: str) -> None:
    ref = api.post("/v1/chat/completions", json={
        "model": model, "messages": MESSAGES, "max_tokens": 12, "temperature": 0}).json()
    body = {"model": model, "messages": MESSAGES, "options": {"num_predict": 12,
                                                              "temperature": 0}}
    whole = api.post("/api/chat", json={**body, "stream": False}).json()
    assert whole["message"] == {"role": "assistant",
                                "content": ref["choices"][0]["message"]["content"]}
    assert whole["done"] is True and whole["done_reason"] == ref["choices"][0]["finish_reason"]
    assert whole["prompt_eval_count"] == ref["usage"]["prompt_tokens"]
    assert whole["eval_count"] == ref["usage"]["completion_tokens"]
    durations = [whole[k] for k in ("total_duration", "load_duration", "prompt_eval_duration",
                                    "eval_duration")]
    assert all(isinstance(d, int) and d >= 0 for d in durations)
    assert whole["total_duration"] >= whole["prompt_eval_duration"] + whole["eval_duration"] > 0
    assert whole["created_at"].endswith("Z") and whole["model"] == model
    lines = ndjson(api.post("/api/chat", json=body))  # streams by default
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(x["message"]["content"] for x in lines) == whole["message"]["content"]
    last = lines[-1]
    assert last["message"]["content"] == "" and last["eval_count"] == whole["eval_count"]


def test_generate_templated_and_raw(api: httpx.Client, model: str) -> None:
    chat = api.post("/v1/chat/completions", json={
        "model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0}).json()
    body = {"model": model, "prompt": "Hello!", "system": "Be brief.", "stream": False,
            "options": {"num_predict": 8, "temperature": 0}}
    whole = api.post("/api/generate", json=body).json()
    assert whole["response"] == chat["choices"][0]["message"]["content"]
    lines = ndjson(api.post("/api/generate", json={**body, "stream": True}))
    assert "".join(x["response"] for x in lines) == whole["response"] and lines[-1]["done"]
    raw = api.post("/api/generate", json={"model": model, "prompt": "Once upon", "raw": True,
                                          "stream": False, "options": {"num_predict": 8,
                                                                       "temperature": 0}})
    ref = api.post("/v1/completions", json={"model": model, "prompt": "Once upon",
                                            "max_tokens": 8, "temperature": 0}).json()
    assert raw.json()["response"] == ref["choices"][0]["text"]
    assert raw.json()["prompt_eval_count"] == ref["usage"]["prompt_tokens"]


def test_options_map_onto_the_same_sampling(api: httpx.Client, model: str) -> None:
    options = {"temperature": 0.9, "top_p": 0.95, "top_k": 20, "min_p": 0.01, "seed": 7,
               "repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.4,
               "num_predict": 10, "num_ctx": 4096}  # num_ctx: accepted, changes nothing
    got = api.post("/api/generate", json={"model": model, "prompt": "Once upon", "raw": True,
                                          "stream": False, "options": options}).json()
    openai_names = {"repeat_penalty": "repetition_penalty", "num_predict": "max_tokens"}
    ref = api.post("/v1/completions", json={
        "model": model, "prompt": "Once upon", **{openai_names.get(k, k): v for k, v in
                                                  options.items() if k != "num_ctx"}}).json()
    assert got["response"] == ref["choices"][0]["text"] and got["eval_count"] > 0
    other = api.post("/api/generate", json={"model": model, "prompt": "Once upon", "raw": True,
                                            "stream": False,
                                            "options": {**options, "seed": 8}}).json()
    assert other["response"] != got["response"]


def test_stop_option_and_empty_prompts_load(api: httpx.Client, model: str) -> None:
    full = api.post("/api/generate", json={"model": model, "prompt": "Once upon", "raw": True,
                                           "stream": False, "options": {"num_predict": 12,
                                                                        "temperature": 0}}).json()
    stop = full["response"][3:5]
    cut = api.post("/api/generate", json={"model": model, "prompt": "Once upon", "raw": True,
                                          "stream": False, "options": {
                                              "num_predict": 12, "temperature": 0,
                                              "stop": [stop]}}).json()
    assert cut["response"] == full["response"][:full["response"].find(stop)]
    assert cut["done_reason"] == "stop"
    for path, body in (("/api/chat", {"messages": []}), ("/api/generate", {"prompt": ""})):
        r = api.post(path, json={"model": model, **body})
        assert r.json()["done"] is True and r.json()["done_reason"] == "load"


def test_disconnect_mid_stream_cancels(live_server, model: str) -> None:  # noqa: F811
    before = live_server.wait_idle()
    client = httpx.Client(headers=AUTH, timeout=60)
    body = {"model": model, "prompt": "Once upon", "raw": True,
            "options": {"num_predict": 200, "temperature": 0}}
    with client.stream("POST", f"{live_server.url}/api/generate", json=body) as response:
        lines = response.iter_lines()
        assert json.loads(next(lines))["done"] is False
    client.close()
    deadline = time.monotonic() + 10
    while live_server.health()["num_cancelled"] != before["num_cancelled"] + 1:
        assert time.monotonic() < deadline, live_server.health()
        time.sleep(0.02)
    assert live_server.wait_idle()["num_finished"] == before["num_finished"]


def test_format_schema_constrains_the_answer(api: httpx.Client, model: str) -> None:
    """Ollama's `format`: a JSON schema (or "json") the answer must follow."""
    import json

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    body = {"model": model, "messages": MESSAGES, "stream": False, "format": schema,
            "options": {"num_predict": 40, "temperature": 0.5, "seed": 2}}
    answer = api.post("/api/chat", json=body).json()["message"]["content"]
    assert set(json.loads(answer)) == {"n"} and 0 <= json.loads(answer)["n"] <= 9
