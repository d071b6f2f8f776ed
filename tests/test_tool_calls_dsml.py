"""DeepSeek-V3.2's and V4's tool calls (DSML): the bundled templates render what their encodings
do (restated plainly below as the references), `deepseek32` and `deepseek4` files without a
template get them, and a required call over the official `openai` client on a tiny V3.2 model
comes back as OpenAI's calls, streaming and not, with an earlier turn's calls written back as
parameters."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from hybrid.tokenizer.bundled_templates import bundled_template
from hybrid.tokenizer.chat_template import ChatTemplate
from server.tools.formats import DEEPSEEK_V4, render_dsml
from tests.test_server_support import API_KEY, LiveServer
from tests.test_tool_calls import SCHEMAS, TOOLS

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
D = "｜DSML｜"


def _example(block: str, name: str) -> str:
    """The encodings' example of a DSML block (V3.2: function_calls, $FUNCTION_NAME; V4:
    tool_calls, $TOOL_NAME)."""
    return (f'<{D}{block}>\n<{D}invoke name="${name}">\n<{D}parameter name="$PARAMETER_NAME" '
            f'string="true|false">$PARAMETER_VALUE</{D}parameter>\n...\n</{D}invoke>\n'
            f'<{D}invoke name="${name}2">\n...\n</{D}invoke>\n</{D}{block}>')


def _tools_text(tools: list[dict], v4: bool = False) -> str:
    """The encodings' tools section (V3.2's TOOLS_SYSTEM_TEMPLATE, V4's TOOLS_TEMPLATE), the
    functions as JSON lines."""
    functions = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    if not v4:
        return (
            "## Tools\n\nYou have access to a set of tools you can use to answer the user's "
            f'question.\nYou can invoke functions by writing a "<{D}function_calls>" block like '
            "the following as part of your reply to the user:\n"
            f"{_example('function_calls', 'FUNCTION_NAME')}\n\n"
            "String and scalar parameters should be specified as is without any escaping or "
            "quotes, while lists and objects should use JSON format. The \"string\" attribute "
            "should be set to \"true\" for string type parameters and \"false\" for other types "
            "(numbers, booleans, arrays, objects).\n\nIf the thinking_mode is enabled, then after "
            "function results you should strongly consider outputting a thinking block. Here is "
            f"an example:\n\n<{D}function_calls>\n...\n</{D}function_calls>\n\n<function_results>"
            "\n...\n</function_results>\n\n<think>...thinking about results</think>\n\nHere are "
            f"the functions available in JSONSchema format:\n<functions>\n{functions}\n"
            "</functions>\n")
    return (
        "## Tools\n\nYou have access to a set of tools to help answer the user's question. You "
        f'can invoke tools by writing a "<{D}tool_calls>" block like the following:\n\n'
        f"{_example('tool_calls', 'TOOL_NAME')}\n\n"
        'String parameters should be specified as is and set `string="true"`. For all other '
        "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
        '`string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST '
        "output your complete reasoning inside <think>...</think> BEFORE any tool calls or "
        "final response.\n\nOtherwise, output directly after </think> with tool calls or "
        f"final response.\n\n### Available Tool Schemas\n\n{functions}\n\nYou MUST strictly "
        "follow the above defined tool name and parameter schemas to invoke tool calls.\n")


def reference_prompt(messages: list[dict], tools: list[dict] | None, thinking: bool) -> str:
    """V3.2's encoding (encode_messages, reasoning of earlier turns dropped), message by
    message: the tools after the first system message (or where one would be); a user turn
    opens the reply with <think> in thinking mode if it is the last, else closes it; a call's
    results in one function_results block, after which the reply opens or closes a think
    block as after the last user turn; an assistant turn after the last user turn writes its
    reasoning and </think> in thinking mode."""
    out = BOS
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    if tools and (not messages or messages[0]["role"] != "system"):
        out += "\n\n" + _tools_text(tools)
    assistant = -1
    for i, m in enumerate(messages):
        if m["role"] == "system":
            out += m["content"] + ("\n\n" + _tools_text(tools) if i == 0 and tools else "")
        elif m["role"] == "user":
            out += f"<｜User｜>{m['content']}<｜Assistant｜>"
            out += "<think>" if thinking and i == last_user else "</think>"
        elif m["role"] == "tool":
            order, calls = i - assistant, len(messages[assistant]["tool_calls"])
            out += ("\n\n<function_results>" if order == 1 else "") + \
                f"\n<result>{m['content']}</result>"
            if order == calls:
                out += "\n</function_results>\n\n"
                out += "<think>" if thinking and i >= last_user else "</think>"
        else:
            assistant = i
            if thinking and i > last_user:
                out += m.get("reasoning_content", "") + "</think>"
            out += m.get("content") or ""
            if m.get("tool_calls"):
                out += "\n\n" + render_dsml([(c["function"]["name"], c["function"]["arguments"])
                                              for c in m["tool_calls"]])
            out += EOS
    return out


def _conversation() -> list[dict]:
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
             {"id": "call_2", "type": "function",
              "function": {"name": "get_time", "arguments": {"zone": "CET", "when": [1, "x"]}}}]
    return [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": calls,
             "reasoning_content": "two tools"},
            {"role": "tool", "tool_call_id": "call_1", "content": "22C <sunny> & dry"},
            {"role": "tool", "tool_call_id": "call_2", "content": "noon"}]


def reference_prompt_v4(messages: list[dict], tools: list[dict] | None, thinking: bool) -> str:
    """V4's encoding (encode_messages): tool messages merged into user turns (a run of user and
    tool messages is one turn, its parts apart by a blank line, tool results as <tool_result>
    blocks sorted by the order of the calls before them); a user turn followed by an assistant
    turn, or ending the prompt, opens the reply with <think> in thinking mode where it is the
    last user turn or where tools are given (no reasoning is dropped then); an assistant turn
    writes its reasoning in thinking mode after the last user turn (or always, with tools)."""
    merged: list[dict] = []
    for m in messages:
        if m["role"] in ("user", "tool"):
            if merged and merged[-1]["role"] == "user":
                merged[-1]["parts"].append(m)
            else:
                merged.append({"role": "user", "parts": [m]})
        else:
            merged.append(m)
    order: dict[str, int] = {}
    for m in merged:
        if m["role"] == "assistant" and m.get("tool_calls"):
            order = {c["id"]: k for k, c in enumerate(m["tool_calls"])}
        elif m["role"] == "user":
            results = iter(sorted((p for p in m["parts"] if p["role"] == "tool"),
                                  key=lambda p: order.get(p["tool_call_id"], 0)))
            m["parts"] = [next(results) if p["role"] == "tool" else p for p in m["parts"]]
    keep = bool(tools)
    last_user = max((i for i, m in enumerate(merged) if m["role"] == "user"), default=-1)
    out = BOS
    if tools and (not messages or messages[0]["role"] != "system"):
        out += "\n\n" + _tools_text(tools, v4=True)
    for i, m in enumerate(merged):
        if m["role"] == "system":
            out += m["content"] + ("\n\n" + _tools_text(tools, v4=True) if i == 0 and tools else "")
        elif m["role"] == "user":
            out += "<｜User｜>" + "\n\n".join(
                p["content"] if p["role"] == "user" else f"<tool_result>{p['content']}</tool_result>"
                for p in m["parts"])
            if i + 1 == len(merged) or merged[i + 1]["role"] == "assistant":
                out += "<｜Assistant｜>"
                out += "<think>" if thinking and (keep or i >= last_user) else "</think>"
        else:
            if thinking and (keep or i > last_user):
                out += m.get("reasoning_content", "") + "</think>"
            out += m.get("content") or ""
            if m.get("tool_calls"):
                out += "\n\n" + render_dsml([(c["function"]["name"], c["function"]["arguments"])
                                              for c in m["tool_calls"]], DEEPSEEK_V4)
            out += EOS
    return out


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("shape", ["whole", "no system", "no tools", "ends with user",
                                   "results then text"])
@pytest.mark.parametrize("family", ["deepseek-v3.2", "deepseek-v4"])
def test_templates_render_as_the_encodings(family: str, thinking: bool, shape: str) -> None:
    messages, tools = _conversation(), TOOLS
    messages = messages[:5] + [messages[6], messages[5]]  # results out of the calls' order
    if shape == "no system":
        messages = messages[1:]
    elif shape == "no tools":
        tools = None
    elif shape == "ends with user":
        messages = messages[:4]
    elif shape == "results then text":
        messages = [*messages, {"role": "user", "content": "and?"},
                    {"role": "assistant", "content": "Done.", "reasoning_content": "r"},
                    {"role": "user", "content": "bye"}]
    ours = ChatTemplate(bundled_template(family), BOS, EOS).render(
        messages, tools=tools, thinking=thinking)
    reference = reference_prompt if family == "deepseek-v3.2" else reference_prompt_v4
    assert ours == reference(messages, tools, thinking)
    assert ours.endswith("<think>" if thinking else "</think>")


@pytest.mark.parametrize("preset,layout,name", [("tiny-v32", "mla", "deepseek-v3.2"),
                                               ("tiny-v4", "legacy", "deepseek-v4")])
def test_files_without_a_template_get_their_familys(models, preset, layout, name) -> None:
    from hybrid.gguf.reader import GGUFModelFile
    from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer

    meta = GGUFModelFile(models.path(preset, "f32" if preset == "tiny-v4" else "q4_k_m",
                                     layout)).metadata
    assert "tokenizer.chat_template" not in meta  # as V3.2's and V4's conversions are
    assert GGUFTokenizer(meta).chat_template.source == bundled_template(name)


@pytest.fixture(scope="module")
def served(models):
    from server.config import ServerConfig
    from server.serve import build_state

    config = ServerConfig.from_flat({
        "gguf_path": str(models.path("tiny-v32", "q4_k_m", "mla")), "optimize_rules": "cpu.yaml",
        "max_new_tokens": 800, "api_key": API_KEY})
    server = LiveServer(build_state(config, warmup=False))
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                           timeout=120)
    try:
        yield client, server.state.model.name
    finally:
        server.close()


def test_required_call_comes_back_as_openai_calls(served) -> None:
    client, model = served
    history = _conversation()[:4]
    for seed in range(2):
        args = {"model": model, "messages": history, "tools": TOOLS, "tool_choice": "required",
                "max_tokens": 300, "seed": seed, "temperature": 0.8,
                "parallel_tool_calls": False}
        r = client.chat.completions.create(**args)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.function.name in SCHEMAS
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        pieces: dict[int, dict] = {}
        for chunk in client.chat.completions.create(**args, stream=True):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = pieces.setdefault(d.index, {"name": d.function.name, "arguments": ""})
                entry["arguments"] += d.function.arguments or ""
        assert list(pieces.values()) == [{"name": call.function.name,
                                          "arguments": call.function.arguments}]
    # thinking mode: the reply opens inside a think block, reasons, then calls
    r = client.chat.completions.create(**{**args, "reasoning_effort": "high", "max_tokens": 800})
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.reasoning_content is not None
    jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments),
                        SCHEMAS[r.choices[0].message.tool_calls[0].function.name])


def test_history_calls_are_written_back_and_bad_arguments_refused(served) -> None:
    client, model = served
    history = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(
        c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in _conversation()]
    r = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, max_tokens=300, seed=1,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    with pytest.raises(openai.BadRequestError, match="only assistant messages carry"):
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": "hi", "reasoning_content": "no"}])
    history[4]["tool_calls"][0]["function"]["arguments"] = "{not json"
    with pytest.raises(openai.BadRequestError, match="arguments is not JSON"):
        client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=4)
