"""Tool calling: the families' real templates render as transformers renders them; the streamed
parser splits text from calls in each format whatever the token boundaries, and degrades
malformed output to text; a required call is well formed under the grammar, over the official
`openai` client on the real DeepSeek-V3 and R1 templates, streaming and not; 16 concurrent
agent loops end with every KV page back."""

from __future__ import annotations

import json
import random
import threading

import jsonschema
import openai
import pytest

from hybrid.tokenizer.bundled_templates import BUNDLED_TEMPLATES, bundled_template
from hybrid.tokenizer.chat_template import ChatTemplate
from server.tools.formats import FORMATS, detect_format
from server.tools.setup import call_parser
from tests.test_server_support import API_KEY, LiveServer

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
WEATHER = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Rome", "Oslo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather <soon> & now",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _history(empty_content):
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}},
             {"id": "call_2", "type": "function",
              "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": empty_content, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "22C <sunny> & dry"},
            {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
            {"role": "assistant", "content": "<think>easy</think>22C at noon."},
            {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("name", BUNDLED_TEMPLATES)
def test_real_templates_render_as_transformers_renders_them(name: str) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    source = bundled_template(name)
    messages = _history("" if name.startswith("kimi") else None)
    if name in ("deepseek-v3.2", "deepseek-v4"):  # they read earlier calls' arguments as objects
        for call in messages[2]["tool_calls"]:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    for tools in (None, TOOLS):
        for gen in (True, False):
            ours = ChatTemplate(source, BOS, EOS).render(messages, add_generation_prompt=gen,
                                                         tools=tools)
            theirs = render_jinja_template([messages], tools=tools, chat_template=source,
                                           add_generation_prompt=gen, bos_token=BOS,
                                           eos_token=EOS)[0][0]
            assert ours == theirs
    fmt = detect_format(source, set())
    assert fmt.name == {"deepseek-v3": "deepseek-v3", "deepseek-r1": "deepseek-v3",
                        "deepseek-v3.1": "deepseek-v3.1",
                        "deepseek-v3.2": "deepseek-v3.2",
                        "deepseek-v4": "deepseek-v4"}.get(name, "kimi-k2")
    if name != "kimi-k2":  # Kimi-K2's first template does not write earlier calls back
        assert fmt.render([("get_time", '{"zone": "CET"}')]).split(fmt.call_begin)[0] in ours


CALLS = [("get_weather", '{"city": "Paris ``` x", "days": 2}'), ("get_time", "{}")]


def _parse_in_pieces(fmt, text: str, rng: random.Random):
    parser, content, calls = call_parser(fmt), "", {}
    i = 0
    while i < len(text):
        n = rng.randint(1, 6)
        c, deltas = parser.feed(text[i:i + n])
        i += n
        content += c
        for d in deltas:
            entry = calls.setdefault(d.index, {"id": d.id, "name": d.name, "arguments": ""})
            assert (d.id is None) == (d.name is None) and (d.id is None or entry["id"] == d.id)
            entry["arguments"] += d.arguments
    c, deltas = parser.finish()
    for d in deltas:
        calls[d.index]["arguments"] += d.arguments
    return content + c, [calls[k] for k in sorted(calls)], parser


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_streamed_parser_splits_text_from_calls_at_any_token_boundary(fmt) -> None:
    text = "Let me check." + fmt.render(CALLS) + " Done."
    rng = random.Random(0)
    for _ in range(100):
        content, calls, parser = _parse_in_pieces(fmt, text, rng)
        assert content == "Let me check. Done."
        assert [(c["name"], c["arguments"]) for c in calls] == CALLS
        assert [(c.name, c.arguments) for c in parser.calls] == CALLS
    if fmt.name == "kimi-k2":
        assert [c["id"] for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]
    else:
        assert all(c["id"].startswith("call_") for c in calls)


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_malformed_calls_degrade_to_text(fmt) -> None:
    rng = random.Random(1)
    good = fmt.render([CALLS[0]])
    for broken in (
        "x" + fmt.section_begin + "not a call at all",  # a marker out of place
        "x" + fmt.section_begin + fmt.call_begin + "bad name!" + fmt.header_end + "{}",
        "x" + fmt.section_begin + fmt.call_begin + "a" * 300,  # a header that never ends
        "x" + fmt.section_begin,  # the reply ends right after the block opens
        "x" + good[:len(fmt.section_begin) + len(fmt.call_begin) + 3],  # inside the header
        "plain text with < and ``` and <｜ but no markers",
    ):
        content, calls, _ = _parse_in_pieces(fmt, broken, rng)
        assert (content, calls) == (broken, [])
    # cut short inside the arguments: the call stays, with what it has
    cut = good[:good.index('"days"')]
    content, calls, _ = _parse_in_pieces(fmt, cut, rng)
    assert content == "" and calls[0]["name"] == "get_weather"
    if fmt.dsml:  # the parameters it closed
        assert calls[0]["arguments"] == '{"city": "Paris ``` x"}'
    else:
        assert calls[0]["arguments"] == '{"city": "Paris ``` x", '  # as written


# -- over HTTP, with the real templates ---------------------------------------------------------

def _server(models, template: str, batch: int) -> LiveServer:
    from server.config import ServerConfig
    from server.serve import build_state

    path = models.path("tiny-v3", "q4_k_m", chat_template=template)
    config = ServerConfig.from_flat({
        "gguf_path": str(path), "optimize_rules": "cpu.yaml", "max_batch_size": batch,
        "max_new_tokens": 512, "api_key": API_KEY})
    return LiveServer(build_state(config))


@pytest.fixture(scope="module", params=["deepseek-v3", "deepseek-r1"])
def served(request, models):
    server = _server(models, request.param, 16)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                           timeout=120)
    try:
        yield server, client, server.state.model.name, request.param
    finally:
        server.close()


def _check_calls(calls, names=None) -> None:
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_call_is_well_formed_streaming_and_not(served) -> None:
    _, client, model, template = served
    messages = [{"role": "user", "content": "What is the weather in Rome?"}]
    one = {"parallel_tool_calls": False}  # a random model would call until max_tokens
    for seed in range(3):
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           tool_choice="required", max_tokens=200, seed=seed,
                                           temperature=0.8, **one)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", (choice.message, r.usage)
        _check_calls(choice.message.tool_calls)
        if template == "deepseek-r1":
            assert choice.message.reasoning_content is not None
        stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                tool_choice="required", max_tokens=200,
                                                seed=seed, temperature=0.8, stream=True, **one)
        pieces: dict[int, dict] = {}
        finish = None
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            for d in delta.tool_calls or []:
                entry = pieces.setdefault(d.index, {"id": d.id, "name": d.function.name,
                                                    "arguments": ""})
                entry["arguments"] += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls"
        assert [(p["id"] is not None, p["name"], p["arguments"]) for p in pieces.values()] == [
            (True, c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    if template == "deepseek-v3":  # parallel calls: at most MAX_PARALLEL_CALLS, all well formed
        from server.tools.grammar import MAX_PARALLEL_CALLS

        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           tool_choice="required", max_tokens=500, seed=0)
        assert r.choices[0].finish_reason == "tool_calls"
        assert 1 <= len(r.choices[0].message.tool_calls) <= MAX_PARALLEL_CALLS
        _check_calls(r.choices[0].message.tool_calls)


def test_named_function_and_history_with_calls(served) -> None:
    _, client, model, _template = served
    history = _history(None)[:-1] + [{"role": "user", "content": "And the time?"}]
    r = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, max_tokens=200, seed=4,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1
    _check_calls(calls, ["get_time"])
    # auto: whatever the random model writes comes back as text or calls, never an error
    r = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=24,
                                       seed=5)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # none: the tools are not described and nothing is parsed
    r = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=4,
                                       tool_choice="none")
    assert r.choices[0].message.tool_calls is None


@pytest.mark.parametrize("body,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools.2.function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}}}],
      "tool_choice": "required"}, "tools"),
])
def test_bad_tools_are_400s_naming_the_field(served, body, param) -> None:
    _, client, model, _template = served
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": "hi"}], **body)
    assert e.value.body["param"] == param


def test_sixteen_agent_loops_over_http(served) -> None:
    """16 concurrent loops, 4 rounds each: tools in the request, a required call, its result sent
    back. Every call well formed, no 5xx, every KV page back at the end."""
    server, client, model, template = served
    if template != "deepseek-v3":
        pytest.skip("one template is enough for the load test")
    errors: list[BaseException] = []

    def agent(k: int) -> None:
        try:
            messages = [{"role": "user", "content": f"Agent {k}: plan a trip."}]
            for round_ in range(4):
                r = client.chat.completions.create(
                    model=model, messages=messages, tools=TOOLS, tool_choice="required",
                    parallel_tool_calls=False, max_tokens=120, temperature=1.0,
                    seed=k * 10 + round_)
                msg = r.choices[0].message
                assert r.choices[0].finish_reason == "tool_calls"
                _check_calls(msg.tool_calls)
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    c.model_dump() for c in msg.tool_calls]})
                messages += [{"role": "tool", "tool_call_id": c.id, "content": f"result {k}"}
                             for c in msg.tool_calls]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[0]
    health = server.wait_idle()
    assert health["kv_pages_used"] == 0 and health["num_failed"] == 0


def test_ollama_tools_history_and_calls(served) -> None:
    """Ollama's /api/chat: tools and a history of calls (arguments as objects, tool_name on the
    results) render; a reply's calls come back whole, arguments as an object."""
    import httpx

    from hybrid.engine.scheduling.request import TokenOutput
    from server.ollama import _add_tool_calls, _chat_body
    from server.openai_format import ChoiceState, Delta
    from server.tools.setup import model_format, tool_request

    server, _client, model, _template = served
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Oslo",
                                                                       "days": 1}}}]},
                {"role": "tool", "content": "cold", "tool_name": "get_weather"}]
    r = httpx.post(f"{server.url}/api/chat", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": model, "messages": messages, "tools": TOOLS, "stream": False,
                         "options": {"num_predict": 4}}, timeout=60)
    assert r.status_code == 200 and r.json()["done"], r.text

    tok = server.state.model.tokenizer
    setup, _ = tool_request(TOOLS, None, None, tok, model_format(tok))
    choice = ChoiceState(tools=setup)
    text = "Sure." + setup.fmt.render([("get_time", '{"zone": "UTC"}'), ("get_time", "{bad")])
    for k in range(0, len(text), 3):
        end = k + 3 >= len(text)
        choice.add(TokenOutput(0, text[k:k + 3], 0.0, (), "stop" if end else None))
    body = _chat_body(Delta(choice.reasoning, choice.text))
    assert _add_tool_calls(body, choice)
    assert body["message"]["tool_calls"] == [{"function": {"name": "get_time",
                                                           "arguments": {"zone": "UTC"}}}]
    assert body["message"]["content"] == "Sure.get_time({bad)"  # not an object: text
    assert choice.reported_finish("stop") == "tool_calls"


def test_serve_chat_template_override_kimi_format_spelled_in_text(models) -> None:
    """--chat-template kimi-k2-thinking on a file whose vocabulary lacks Kimi's markers: the
    grammar spells them in text, and the parser still reads the required call back."""
    from hybrid.errors import HybridError
    from server.config import ServerConfig
    from server.serve import build_state

    with pytest.raises(HybridError, match="neither a bundled name"):
        build_state(ServerConfig.from_flat({"chat_template": "no-such-template"}))
    config = ServerConfig.from_flat({
        "gguf_path": str(models.path("tiny-v3", "q4_k_m")), "optimize_rules": "cpu.yaml",
        "max_new_tokens": 256, "api_key": API_KEY, "chat_template": "kimi-k2-thinking"})
    server = LiveServer(build_state(config, warmup=False))
    try:
        assert "tool_declare" in server.state.model.tokenizer.chat_template.source
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        r = client.chat.completions.create(
            model=server.state.model.name, messages=[{"role": "user", "content": "Time?"}],
            tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=250, seed=3, logprobs=True)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls", "".join(t.token for t in r.choices[0].logprobs.content)
        assert calls[0].id == \
            "functions.get_time:" + calls[0].id.rsplit(":", 1)[1]
        _check_calls(calls, ["get_time"])
    finally:
        server.close()


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
@pytest.mark.parametrize("think", [False, True])
def test_call_grammar_takes_the_formats_own_rendering(models, fmt, think) -> None:
    """The required-call grammar accepts what the family's template writes for well-formed
    calls (markers as special tokens where the vocabulary has them, as text where not), and
    refuses arguments outside the schema."""
    import llguidance

    from hybrid.engine.sampling.grammar import GrammarVocab
    from hybrid.gguf.reader import GGUFModelFile
    from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer
    from server.tools.grammar import tool_call_grammar

    tok = GGUFTokenizer(GGUFModelFile(models.path("tiny-v3", "q4_k_m")).metadata)
    vocab = GrammarVocab(tok.hf_json(), tok.vocab_size, tok.eos_token_id)
    grammar = tool_call_grammar(fmt, SCHEMAS, tok.single_token, True,
                                "</think>" if think else None, 64)
    prefix = "some reasoning</think>\n\n" if think else ""

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(vocab.tokenizer, grammar)
        return all(m.consume_token(t) for t in tok.encode(text, add_bos=False)) and \
            m.is_accepting()

    calls = [("get_weather", '{"city": "Oslo", "days": 3}'), ("get_time", '{"zone": "UTC"}')]
    assert accepts(prefix + fmt.render(calls))
    assert accepts(prefix + fmt.render(calls[1:]))
    assert not accepts(prefix + fmt.render([("get_weather", '{"city": "Lima", "days": 3}')]))
    assert not accepts(prefix + fmt.render([("get_time", '{"zone": "UTC"}')])[:-5])
