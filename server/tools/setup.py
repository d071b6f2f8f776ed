"""A chat request's tools: checked, put into the prompt, and (when a call is required) into a
grammar; the per-reply parser that turns the model's calls back into OpenAI's `tool_calls`.

`tool_choice`: "auto" (the default with tools) lets the model answer or call; "none" renders
the history but neither describes the tools nor parses calls; "required" and a named function
constrain the reply to well-formed calls (one, when `parallel_tool_calls` is false or a function
is named). The legacy `functions`/`function_call` fields map onto the same.

Templates that declare `tools` themselves (Kimi-K2's) get them as the variable; DeepSeek's do
not, so the tools are described in a system message in the family's own call syntax.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from hybrid.errors import RequestRejected
from server.errors import bad_request
from server.reasoning import THINK_END
from server.tools.dsml import DsmlCallParser
from server.tools.formats import (
    ToolFormat,
    detect_format,
    template_declares_tools,
    tools_system_prompt,
)
from server.tools.parser import ToolCallParser

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ToolSetup:
    """What one chat request's replies need to parse (and maybe constrain) tool calls."""

    fmt: ToolFormat
    functions: dict[str, dict[str, Any]]  # name -> parameters schema
    mode: str  # "auto", "required" or "named" ("none" has no setup)
    named: str | None  # the function tool_choice names
    parallel: bool
    marker_text: dict[int, str] = field(default_factory=dict)  # control token id -> its text

    def parser(self) -> ToolCallParser | DsmlCallParser:
        return call_parser(self.fmt)

    @property
    def forced(self) -> bool:
        return self.mode != "auto"

    def grammar(self, tokenizer: Any, opens_think: bool, max_tokens: int,
                lenient: bool = False) -> str | None:
        """The reply's grammar when a call is required (None for auto); `lenient`: parameter
        objects take keys their schema does not list (--lenient-schemas)."""
        if not self.forced:
            return None
        from server.tools.grammar import tool_call_grammar

        functions = self.functions if self.named is None else \
            {self.named: self.functions[self.named]}
        parallel = self.parallel and self.named is None
        try:
            return tool_call_grammar(self.fmt, functions, tokenizer.single_token, parallel,
                                     THINK_END if opens_think else None, max_tokens // 2,
                                     lenient)
        except RequestRejected as e:
            raise bad_request(str(e), "tools") from None


def call_parser(fmt: ToolFormat) -> ToolCallParser | DsmlCallParser:
    """A reply's parser for `fmt`: DSML's parameters, or the others' JSON arguments."""
    return DsmlCallParser(fmt) if fmt.dsml else ToolCallParser(fmt)


def model_format(tokenizer: Any) -> ToolFormat:
    """The served model's call format (from its chat template, else its vocabulary)."""
    from server.tools.formats import FORMATS

    vocabulary = {f.section_begin for f in FORMATS.values()
                  if tokenizer.single_token(f.section_begin) is not None}
    return detect_format(tokenizer.chat_template.source, vocabulary)


def tool_request(tools: list[Any] | None, choice: Any, parallel: bool | None,
                 tokenizer: Any, fmt: ToolFormat) -> tuple[ToolSetup | None, list[dict[str, Any]]]:
    """(the setup, or None when no call can happen; the tools to give the template);
    `fmt`: model_format(tokenizer)."""
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice is only allowed when tools are specified",
                              "tool_choice")
        return None, []
    functions = _functions(tools)
    mode, named = _choice(choice, functions)
    if mode == "none":
        return None, []
    markers = (*fmt.markers, fmt.header_sep, THINK_END)
    marker_text = {i: m for m in markers if (i := tokenizer.single_token(m)) is not None}
    return ToolSetup(fmt, functions, mode, named, parallel is not False, marker_text), tools


def openai_tools(req: Any) -> tuple[list[Any], Any]:
    """(tools, tool_choice) of a chat request; the legacy `functions` and `function_call`
    fields are the same thing."""
    if req.functions:
        if req.tools:
            raise bad_request("give tools or functions, not both", "functions")
        tools = [{"type": "function", "function": f} for f in req.functions]
        fc = req.function_call
        choice = {"type": "function", "function": fc} if isinstance(fc, dict) else fc
        return tools, choice
    return list(req.tools or []), req.tool_choice


def add_tools_to_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                          setup: ToolSetup, template_source: str) -> list[dict[str, Any]]:
    """The messages with the tools described in a system message, for templates that do not
    declare tools themselves; unchanged otherwise."""
    if template_declares_tools(template_source):
        return messages
    note = {"role": "system", "content": tools_system_prompt(setup.fmt, tools)}
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    return [*messages[:first], note, *messages[first:]]


def history_tool_calls(calls: list[Any], where: str, fmt: ToolFormat) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as the templates read them: arguments as JSON text
    (Ollama sends an object), an object for formats whose template writes each argument
    (DSML), and an id where the client sent none (Ollama's)."""
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls.{j}"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{at}: a tool call is {{'id': str, 'type': 'function', "
                              "'function': {'name': str, 'arguments': str}}", at)
        args = fn.get("arguments", "{}")
        if fmt.object_arguments:
            args = _arguments_object(args, f"{at}.function.arguments")
        elif not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        call_id = call.get("id") or fmt.history_call_id(fn["name"], j)
        if not isinstance(call_id, str):
            raise bad_request(f"{at}.id must be a string", f"{at}.id")
        out.append({"id": call_id, "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def _arguments_object(args: Any, at: str) -> dict[str, Any]:
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            raise bad_request(f"{at} is not JSON; this model's template writes each argument "
                              "of an earlier call, so they must be a JSON object", at) from None
    if not isinstance(args, dict):
        raise bad_request(f"{at} must be a JSON object", at)
    return args


def _functions(tools: list[Any]) -> dict[str, dict[str, Any]]:
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        at = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function" or \
                not isinstance(tool.get("function"), dict):
            raise bad_request(f"{at}: a tool is {{'type': 'function', 'function': {{'name': ..., "
                              "'description': ..., 'parameters': {...}}}}", at)
        fn = tool["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(f"{at}.function.name must be 1-64 letters, digits, '_' or '-', "
                              f"got {name!r}", f"{at}.function.name")
        if name in functions:
            raise bad_request(f"{at}.function.name: {name!r} is declared twice",
                              f"{at}.function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise bad_request(f"{at}.function.parameters must be a JSON schema object",
                              f"{at}.function.parameters")
        if "description" in fn and not isinstance(fn["description"], str):
            raise bad_request(f"{at}.function.description must be a string",
                              f"{at}.function.description")
        functions[name] = params
    return functions


def _choice(choice: Any, functions: dict[str, dict[str, Any]]) -> tuple[str, str | None]:
    """(mode, the named function)."""
    if choice is None:
        return "auto", None
    if choice in ("auto", "none", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and \
            isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in functions:
            raise bad_request(f"tool_choice names the function {name!r}, which is not among "
                              f"the tools ({', '.join(functions)})", "tool_choice")
        return "named", name
    raise bad_request("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', "
                      "'function': {'name': ...}}", "tool_choice")

