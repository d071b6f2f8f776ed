"""The official `openai` client against a live server: chat and completions, streaming and not,
stop strings, logprobs, usage, n, seed, clamping, penalties and min_p; equality with
`LLM.generate`; --force-think's reasoning split; and cancel on disconnect (queued or running),
checked through /health's counters."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from hybrid.engine.sampling.sampling_params import SamplingParams
from tests.test_server_support import API_KEY, MAX_NEW_TOKENS, live_server  # noqa: F401

PROMPT_IDS = [0, 9]


@pytest.fixture(scope="module")
def client(live_server) -> openai.OpenAI:  # noqa: F811
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=API_KEY, max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def model(live_server) -> str:  # noqa: F811
    return live_server.state.model.name


def test_models_lists_the_served_model(client: openai.OpenAI, model: str) -> None:
    assert [m.id for m in client.models.list().data] == [model] == ["tiny-v3-q4_k_m-legacy"]
    assert client.models.retrieve(model).id == model


def test_greedy_completion_equals_llm_generate(live_server, client, model) -> None:  # noqa: F811
    prompts = [PROMPT_IDS, [0, 100, 200, 300, 400], [0, 5, 6, 7]]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=0)
    ref = [o.outputs[0] for o in live_server.llm.generate(prompt_token_ids=prompts,
                                                          sampling_params=params)]
    got = client.completions.create(model=model, prompt=prompts, max_tokens=12, temperature=0,
                                    logprobs=0)
    for r, choice in zip(ref, got.choices):
        assert choice.text == r.text and choice.finish_reason == r.finish_reason == "length"
        assert choice.logprobs.token_logprobs == pytest.approx(r.logprobs, abs=1e-5)
    assert got.usage.prompt_tokens == sum(map(len, prompts))
    assert got.usage.completion_tokens == 36


def test_penalties_and_min_p_equal_llm_generate(live_server, client, model) -> None:  # noqa: F811
    extras = {"min_p": 0.02, "repetition_penalty": 1.4}
    for kwargs in ({"temperature": 0, "presence_penalty": 1.5, "frequency_penalty": 0.7},
                   {"temperature": 0.8, "seed": 5, "presence_penalty": -0.5,
                    "frequency_penalty": 0.3}):
        params = SamplingParams(max_tokens=16, **kwargs, **extras)
        ref = live_server.llm.generate(prompt_token_ids=[PROMPT_IDS], sampling_params=params)
        got = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=16,
                                        extra_body=extras, **kwargs)
        assert got.choices[0].text == ref[0].outputs[0].text
    plain = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=16,
                                      temperature=0)
    penalized = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=16,
                                          temperature=0, frequency_penalty=2)
    assert plain.choices[0].text != penalized.choices[0].text  # greedy is steered too


def test_force_think_splits_reasoning_from_the_answer(live_server) -> None:  # noqa: F811
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.reasoning import parse_whole

    state = live_server.state  # the same engine, served by a second app with --force-think
    app = create_app(replace(state, config=replace(state.config, force_think=True)))
    tok = state.model.tokenizer
    prompt_text = tok.apply_chat_template([{"role": "user", "content": "Why?"}])
    assert not prompt_text.endswith("<think>\n")
    ids = tok.encode(prompt_text + "<think>\n", add_bos=False)
    body = {"model": state.model.name, "max_tokens": 24, "temperature": 0}
    with TestClient(app, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        ref = http.post("/v1/completions", json={**body, "prompt": ids, "logprobs": 0}).json()
        whole = http.post("/v1/chat/completions", json={
            **body, "messages": [{"role": "user", "content": "Why?"}]}).json()
        with http.stream("POST", "/v1/chat/completions", json={
                **body, "stream": True, "messages": [{"role": "user", "content": "Why?"}]}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
    assert whole["usage"]["prompt_tokens"] == len(ids)  # the prompt ends with "<think>\n"
    # Token texts include control tokens ("</think>"), which the text of a completion skips.
    tokens = ref["choices"][0]["logprobs"]["tokens"]
    if ref["choices"][0]["finish_reason"] == "stop":
        tokens = tokens[:-1]  # EOS
    reasoning, answer = parse_whole("".join(tokens), in_think=True)
    message = whole["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, answer)
    assert reasoning  # the synthetic model rambles; all of it before </think> is reasoning
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert "".join(d.get("content", "") for d in deltas) == answer


def test_concurrent_streams_equal_each_run_alone(live_server, client, model) -> None:  # noqa: F811
    cases = [([0, 9], 20), ([0, 100, 200, 300, 400], 7), ([0, 5, 6, 7], 13), ([0, 42], 3)]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=n, temperature=0).choices[0]
             .text for p, n in cases]
    results: dict[int, str] = {}

    def run(i: int) -> None:
        stream = client.completions.create(model=model, prompt=cases[i][0], max_tokens=cases[i][1],
                                           temperature=0, stream=True)
        results[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [results[i] for i in range(len(cases))] == alone
    assert live_server.health()["max_running"] == 2  # two in flight at once, the rest queued


def test_chat_non_streaming_with_usage_and_logprobs(client, model) -> None:
    r = client.chat.completions.create(model=model, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
        max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == len(choice.logprobs.content) <= 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    for entry in choice.logprobs.content:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.logprob
        assert entry.logprob <= 0


def test_chat_streaming_matches_non_streaming(client, model) -> None:
    messages = [{"role": "user", "content": "Tell me a story."}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def _stop_across_tokens(client, model) -> tuple[str, str, str]:
    """(full greedy text, a stop string spanning two tokens, the text before it)."""
    full = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=24, temperature=0,
                                     logprobs=0).choices[0]
    toks = full.logprobs.tokens
    for i in range(1, len(toks)):
        a, b = toks[i - 1], toks[i]
        if len(a) >= 2 and len(b) >= 2 and (a + b).isascii() and (a + b).isprintable():
            stop = a[-2:] + b[:2]
            return full.text, stop, full.text[: full.text.find(stop)]
    raise AssertionError(f"no two ASCII tokens in {toks}")


def test_stop_string_split_across_tokens_never_leaks(client, model) -> None:
    full, stop, before = _stop_across_tokens(client, model)
    r = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=24, temperature=0,
                                  stop=[stop, "never-there"])
    assert r.choices[0].text == before and r.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(
        model=model, prompt=PROMPT_IDS, max_tokens=24, temperature=0, stop=stop, stream=True)]
    assert "".join(pieces) == before and stop not in "".join(pieces)
    assert len(before) < len(full)


def test_n_and_seed(client, model) -> None:
    kwargs = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
              "temperature": 1.0, "n": 3, "seed": 1234, "logprobs": True}
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in b.choices]  # the seed makes it repeatable
    assert len(set(texts)) > 1  # choice i samples with seed + i
    assert a.usage.completion_tokens == sum(len(c.logprobs.content) for c in a.choices)


def test_max_tokens_above_cap_is_clamped(client, model) -> None:
    r = client.completions.create(model=model, prompt=PROMPT_IDS, max_tokens=10**12,
                                  temperature=0, stop=None, extra_body={"top_k": 1})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == MAX_NEW_TOKENS


def _open_stream(live_server, max_tokens: int = MAX_NEW_TOKENS):  # noqa: F811
    client = httpx.Client(timeout=30)
    body = {"model": live_server.state.model.name, "prompt": PROMPT_IDS,
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    req = client.build_request("POST", f"{live_server.url}/v1/completions", json=body,
                               headers={"Authorization": f"Bearer {API_KEY}"})
    response = client.send(req, stream=True)
    assert response.status_code == 200
    return client, response


def _wait_for(live_server, predicate, timeout: float = 10) -> dict:  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        h = live_server.health()
        if predicate(h):
            return h
        assert time.monotonic() < deadline, f"never reached: {h}"
        time.sleep(0.02)


def test_disconnect_mid_stream_cancels_running_and_queued(live_server) -> None:  # noqa: F811
    before = live_server.wait_idle()
    streams = [_open_stream(live_server) for _ in range(3)]  # 2 run (max_batch_size), 1 queues
    # NOTE: keep the line iterators alive: a dropped httpx iterator closes its response.
    readers = [response.iter_lines() for _, response in streams[:2]]
    assert all(next(lines).startswith("data: ") for lines in readers)
    _wait_for(live_server, lambda h: h["num_running"] == 2 and h["num_waiting"] == 1)
    for client, response in reversed(streams):  # the queued one first
        response.close()
        client.close()
    after = _wait_for(live_server, lambda h: h["num_cancelled"] == before["num_cancelled"] + 3)
    assert after["num_running"] == after["num_waiting"] == 0
    assert after["num_cancelled_waiting"] == before["num_cancelled_waiting"] + 1
    assert after["num_finished"] == before["num_finished"]
    tokens = after["num_generated_tokens"]
    time.sleep(0.2)
    assert live_server.health()["num_generated_tokens"] == tokens  # nothing runs on


def test_disconnect_while_waiting_for_a_whole_response(live_server) -> None:  # noqa: F811
    before = live_server.wait_idle()
    body = {"model": live_server.state.model.name, "prompt": PROMPT_IDS,
            "max_tokens": MAX_NEW_TOKENS, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live_server.url}/v1/completions", json=body, timeout=0.3,
                   headers={"Authorization": f"Bearer {API_KEY}"})
    after = _wait_for(live_server, lambda h: h["num_cancelled"] == before["num_cancelled"] + 1)
    assert after["num_running"] == 0 and after["num_finished"] == before["num_finished"]


def test_next_turn_reports_its_cached_prompt_tokens(client, model) -> None:
    """A chat's next turn resends the history: its usage says how much of the prompt the
    prefix cache held (OpenAI's prompt_tokens_details.cached_tokens)."""
    history = [{"role": "system", "content": "You answer questions about a long text. " * 30},
               {"role": "user", "content": "What is it about?"}]
    first = client.chat.completions.create(model=model, messages=history, max_tokens=4,
                                           temperature=0)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And then?"}]
    second = client.chat.completions.create(model=model, messages=history, max_tokens=4,
                                            temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens >= 64 and 64 <= cached < second.usage.prompt_tokens


def test_structured_output_follows_the_schema(client, model) -> None:
    """response_format json_schema, streaming and not: the content parses and validates."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "rank": {"type": "integer", "minimum": 1, "maximum": 99},
        "kind": {"enum": ["big", "small"]}},
        "required": ["city", "rank", "kind"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema,
                                                  "strict": True}}
    messages = [{"role": "user", "content": "Name a city."}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=120,
                                       temperature=0.7, seed=1, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=120,
                                            temperature=0.7, seed=1, response_format=fmt,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content
    obj = client.chat.completions.create(model=model, messages=messages, max_tokens=200,
                                         temperature=0, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
