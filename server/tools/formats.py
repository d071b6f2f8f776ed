"""How each deepseek2-architecture family writes tool calls, as its chat template renders them.

  deepseek-v3 (V3, V3-0324, R1, R1-0528):
      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```
      <｜tool▁call▁end｜>, further calls after "\\n", then <｜tool▁calls▁end｜>
  deepseek-v3.1:
      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...
      <｜tool▁calls▁end｜>
  kimi-k2:
      <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX
      <|tool_call_argument_begin|>ARGS<|tool_call_end|>...<|tool_calls_section_end|>
  deepseek-v3.2 (DSML, XML-like; its arguments are parameters, not JSON: server/tools/dsml.py):
      <｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="KEY"
      string="true|false">VALUE</｜DSML｜parameter>...\n</｜DSML｜invoke>...
      \n</｜DSML｜function_calls>
  deepseek-v4: the same, the block named <｜DSML｜tool_calls>

The format is read off the template's text (the markers it writes); a template that writes
none (ours, an older conversion) gets the one whose markers the vocabulary holds.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolFormat:
    name: str
    section_begin: str
    section_end: str
    call_begin: str
    call_end: str
    header_end: str  # between a call's header (name, id) and its JSON arguments
    fenced: bool  # the arguments sit in a ```json fence (closing ``` before call_end)
    call_separator: str  # what the template writes between two calls
    # the call's id is its header (Kimi-K2: `functions.NAME:INDEX`, written back as is);
    # otherwise ids are ours, OpenAI-style
    id_in_header: bool = False
    # an assistant turn that only calls tools: None for DeepSeek's templates (which write the
    # calls only then), "" for Kimi-K2's (which iterate a content that is not a string)
    call_only_content: str | None = None
    # the template reads an earlier call's arguments as an object (DSML writes each as a
    # parameter), not as JSON text
    object_arguments: bool = False

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts a reply's calls are marked with (DSML: its token, which the others hold)."""
        marks = (self.section_begin, self.section_end, self.call_begin, self.call_end,
                 self.header_end)
        return (DSML_TOKEN, *marks) if self.dsml else marks

    @property
    def dsml(self) -> bool:
        """DeepSeek-V3.2's or V4's DSML calls (server/tools/dsml.py reads and writes them)."""
        return self.name in ("deepseek-v3.2", "deepseek-v4")

    def name_of(self, header: str) -> str | None:
        """The function name in a call's header; None if the header is not one."""
        header = header.strip()
        if self.name == "deepseek-v3":
            kind, sep, name = header.partition(self.header_sep)
            return name.strip() if sep and kind.strip() == "function" and _NAME.fullmatch(
                name.strip()) else None
        if self.name == "kimi-k2":
            m = _KIMI_ID.fullmatch(header)
            return m.group(1) if m else None
        return header if _NAME.fullmatch(header) else None

    @property
    def header_sep(self) -> str:
        return "<｜tool▁sep｜>"

    def header(self, name: str, index: int) -> str:
        """The header the model writes for call `index` of function `name`."""
        if self.name == "deepseek-v3":
            return f"function{self.header_sep}{name}\n"
        if self.name == "kimi-k2":
            return kimi_call_id(name, index)
        return name

    def header_grammar(self, name: str, lit) -> str:
        """The header of a call of `name` in llguidance's Lark (`lit(text)`: a marker as its
        special token, or as text); the index of Kimi-K2's is any 1-3 digits."""
        if self.name == "deepseek-v3":
            return f'"function" {lit(self.header_sep)} {json.dumps(name + chr(10))}'
        if self.name == "kimi-k2":
            return f'{json.dumps("functions." + name + ":")} /[0-9]{{1,3}}/'
        return json.dumps(name)

    def new_call_id(self, header: str) -> str:
        """The id of a call the model just wrote with `header`."""
        return header.strip() if self.id_in_header else f"call_{uuid.uuid4().hex[:24]}"

    def history_call_id(self, name: str, index: int) -> str:
        """The id of call `index` of an earlier turn whose client sent none (Ollama)."""
        return kimi_call_id(name, index) if self.id_in_header else f"call_{index}"

    def render(self, calls: list[tuple[str, str]]) -> str:
        """The text of a reply making `calls` ((name, JSON arguments) pairs)."""
        if self.dsml:
            return render_dsml([(name, json.loads(args)) for name, args in calls], self)
        parts = []
        for i, (name, arguments) in enumerate(calls):
            args = f"\n{arguments}\n```" if self.fenced else arguments
            parts.append(f"{self.call_begin}{self.header(name, i)}{self.header_end}{args}"
                         f"{self.call_end}")
        return self.section_begin + self.call_separator.join(parts) + self.section_end


def kimi_call_id(name: str, index: int) -> str:
    """Kimi-K2 names each call `functions.NAME:INDEX`; its template writes the id back as is."""
    return f"functions.{name}:{index}"


_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # OpenAI's function name alphabet, and dots
_KIMI_ID = re.compile(r"(?:functions\.)?([A-Za-z0-9_.\-]{1,64}?):\d+")

DEEPSEEK_V3 = ToolFormat(
    "deepseek-v3", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "```json", fenced=True, call_separator="\n")
DEEPSEEK_V31 = ToolFormat(
    "deepseek-v3.1", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", fenced=False, call_separator="")
KIMI_K2 = ToolFormat(
    "kimi-k2", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
    "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>", fenced=False,
    call_separator="", id_in_header=True, call_only_content="")
DSML_TOKEN = "｜DSML｜"
DEEPSEEK_V32 = ToolFormat(
    "deepseek-v3.2", f"<{DSML_TOKEN}function_calls>", f"</{DSML_TOKEN}function_calls>",
    f'<{DSML_TOKEN}invoke name="', f"</{DSML_TOKEN}invoke>", '">', fenced=False,
    call_separator="\n", object_arguments=True)
DEEPSEEK_V4 = ToolFormat(
    "deepseek-v4", f"<{DSML_TOKEN}tool_calls>", f"</{DSML_TOKEN}tool_calls>",
    f'<{DSML_TOKEN}invoke name="', f"</{DSML_TOKEN}invoke>", '">', fenced=False,
    call_separator="\n", object_arguments=True)
FORMATS = {f.name: f for f in (DEEPSEEK_V3, DEEPSEEK_V31, KIMI_K2, DEEPSEEK_V32, DEEPSEEK_V4)}
DSML_PARAM_END = f"</{DSML_TOKEN}parameter>"


def render_dsml(calls: list[tuple[str, dict[str, Any]]], fmt: ToolFormat = DEEPSEEK_V32) -> str:
    """The DSML block of a reply making `calls` ((name, arguments object) pairs), as V3.2's and
    V4's encodings write an assistant turn's calls (after its content and a blank line): each
    argument a parameter, a string as is (string="true"), anything else as JSON."""
    invokes = []
    for name, arguments in calls:
        params = "\n".join(
            f'<{DSML_TOKEN}parameter name="{key}" string="{str(isinstance(value, str)).lower()}">'
            f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
            f"{DSML_PARAM_END}" for key, value in arguments.items())
        invokes.append(f'{fmt.call_begin}{name}">\n{params}\n{fmt.call_end}')
    return f"{fmt.section_begin}\n" + "\n".join(invokes) + f"\n{fmt.section_end}"


def detect_format(template_source: str, vocabulary: frozenset[str] | set[str]) -> ToolFormat:
    """The family's format: from the markers the template writes, else from the vocabulary."""
    if DSML_TOKEN in template_source:  # V3.2 names the block function_calls, V4 tool_calls
        return DEEPSEEK_V32 if "function_calls" in template_source else DEEPSEEK_V4
    if KIMI_K2.call_begin in template_source or "tool_declare" in template_source:
        return KIMI_K2
    if DEEPSEEK_V3.call_begin in template_source:
        return DEEPSEEK_V3 if "```json" in template_source else DEEPSEEK_V31
    if KIMI_K2.section_begin in vocabulary and DEEPSEEK_V3.section_begin not in vocabulary:
        return KIMI_K2
    return DEEPSEEK_V3


def template_declares_tools(template_source: str) -> bool:
    """The template writes the request's `tools` itself (Kimi-K2's do); DeepSeek's leave them
    to the caller's system prompt."""
    return re.search(r"\btools\b", template_source) is not None


def tools_system_prompt(fmt: ToolFormat, tools: list[dict[str, Any]]) -> str:
    """What a template that does not declare tools is told about them, in the system prompt:
    each function's name, description and JSON-schema parameters, and the call syntax in the
    family's own markers (the layout DeepSeek documents for V3.1's tool prompt)."""
    lines = ["## Tools", "You have access to the following tools:", ""]
    for tool in tools:
        f = tool["function"]
        lines += [f"### {f['name']}", f"Description: {f.get('description', '')}", "",
                  f"Parameters: {json.dumps(f.get('parameters', {}), ensure_ascii=False)}", ""]
    example = fmt.render([("tool_call_name", "tool_call_arguments")])
    lines += ["IMPORTANT: ALWAYS adhere to this exact format for tool use:", example, "",
              ("Where tool_call_name is the name of a tool above and tool_call_arguments is a "
              "JSON object of its parameters. For several calls, put each call after the "
              "previous one inside the same block.")]
    return "\n".join(lines)
