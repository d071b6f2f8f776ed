"""DeepSeek-V3.2's and V4's tool calls (DSML), read back from a streamed reply into OpenAI's
calls (formats.render_dsml writes them as their encodings do). V4 names the block `tool_calls`
where V3.2 names it `function_calls`; the rest is the same.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

A parameter with string="true" holds a string as is (no quotes, no escapes); string="false"
holds JSON (numbers, booleans, arrays, objects). A call's arguments are the JSON object of its
parameters in their order.

The parser streams the text before the block (holding back what may still be the block's
marker, and the blank line the encoding writes before it), then each call: its id and name
once its invoke header is whole, its arguments once its invoke closes. As for the other
formats (parser.py), malformed output degrades to text: a block that breaks the format before
its first call is whole is given back as text, markers and all; once a call is sent it stays
sent, and what follows a broken call is text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from server.reasoning import partial_suffix
from server.tools.formats import DEEPSEEK_V32, DSML_PARAM_END, DSML_TOKEN, ToolFormat
from server.tools.parser import MAX_HEADER_CHARS, ToolCall, ToolCallDelta

INVOKE_BEGIN, INVOKE_END = DEEPSEEK_V32.call_begin, DEEPSEEK_V32.call_end
PARAM_BEGIN, PARAM_END = f"<{DSML_TOKEN}parameter name=", DSML_PARAM_END
_INVOKE = re.compile(rf'\s*<{DSML_TOKEN}invoke name="([A-Za-z0-9_.\-]{{1,64}})">\n?')
_PARAM = re.compile(rf'\s*<{DSML_TOKEN}parameter name="([^"<>]{{1,256}})" '
                    rf'string="(true|false)">')
_TEXT, _BLOCK, _CALL, _PLAIN = "text", "block", "call", "plain"


def parameter_value(text: str, is_string: bool) -> Any:
    """A parameter's value: the text itself, or its JSON (text that is not JSON stays text)."""
    if is_string:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


class DsmlCallParser:
    """Feed text deltas; get back (answer text, call deltas), as ToolCallParser does; `fmt`
    names the block (DEEPSEEK_V32 or DEEPSEEK_V4)."""

    def __init__(self, fmt: ToolFormat = DEEPSEEK_V32) -> None:
        self.begin, self.end = fmt.section_begin, fmt.section_end
        self.calls: list[ToolCall] = []
        self._state = _TEXT
        self._held = ""  # text that may still be (the blank line before) the block's marker
        self._block = ""  # the block's text not yet parsed
        self._raw = ""  # the block's text since it opened, while no call has been sent
        self._args: dict[str, Any] = {}  # the open call's parameters so far

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        out: list[str] = []
        deltas: list[ToolCallDelta] = []
        if self._state == _PLAIN:
            return text, deltas
        if self._state == _TEXT:
            buf, self._held = self._held + text, ""
            i = buf.find(self.begin)
            if i < 0:
                keep = partial_suffix(buf, self.begin)
                keep = len(buf) - len(buf[:len(buf) - keep].rstrip())  # and the blank line
                out.append(buf[:len(buf) - keep])
                self._held = buf[len(buf) - keep:]
                return "".join(out), deltas
            out.append(buf[:i].rstrip())
            self._raw = buf[len(buf[:i].rstrip()):i + len(self.begin)]
            self._state, text = _BLOCK, buf[i + len(self.begin):]
        self._block += text
        if not self.calls:
            self._raw += text
        self._parse(out, deltas)
        return "".join(out), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """What is held once the reply has ended (cut short, or by its end token)."""
        if self._state == _TEXT:
            held, self._held = self._held, ""
            return held, []
        if self._state == _CALL:  # cut short inside a call: it has the parameters it closed
            self._state = _PLAIN
            return "", [self._close_call()]
        if self._state == _BLOCK and not self.calls:
            self._state = _PLAIN
            return self._raw, []  # a block with no whole call: it was text
        return "", []

    def _parse(self, out: list[str], deltas: list[ToolCallDelta]) -> None:
        while self._state in (_BLOCK, _CALL):
            buf = self._block
            if self._state == _BLOCK:
                stripped = buf.lstrip()
                if stripped.startswith(self.end):
                    self._block, self._state = "", _PLAIN
                    out.append(stripped[len(self.end):])
                    return
                m = _INVOKE.match(buf)
                if m is None:
                    if _may_begin(stripped, (self.end, INVOKE_BEGIN)) or \
                            (stripped.startswith(INVOKE_BEGIN)
                             and len(stripped) <= MAX_HEADER_CHARS and '">' not in stripped):
                        return  # whitespace, or a marker or header not yet whole
                    self._broken(out)
                    return
                call_id = f"call_{uuid.uuid4().hex[:24]}"
                self.calls.append(ToolCall(call_id, m.group(1)))
                deltas.append(ToolCallDelta(len(self.calls) - 1, call_id, m.group(1)))
                self._block, self._raw, self._args, self._state = buf[m.end():], "", {}, _CALL
                continue
            stripped = buf.lstrip()
            if stripped.startswith(INVOKE_END):
                deltas.append(self._close_call())
                self._block, self._state = stripped[len(INVOKE_END):], _BLOCK
                continue
            m = _PARAM.match(buf)
            if m is None:
                if _may_begin(stripped, (INVOKE_END, PARAM_BEGIN)) or \
                        (stripped.startswith(PARAM_BEGIN)
                         and len(stripped) <= MAX_HEADER_CHARS and '">' not in stripped):
                    return
                deltas.append(self._close_call())
                self._broken(out)
                return
            end = buf.find(PARAM_END, m.end())
            if end < 0:
                return  # the value is not whole yet
            self._args[m.group(1)] = parameter_value(buf[m.end():end], m.group(2) == "true")
            self._block = buf[end + len(PARAM_END):]

    def _close_call(self) -> ToolCallDelta:
        arguments = json.dumps(self._args, ensure_ascii=False)
        self.calls[-1].arguments = arguments
        return ToolCallDelta(len(self.calls) - 1, arguments=arguments)

    def _broken(self, out: list[str]) -> None:
        """The block does not follow the format: before any call it was text; after one, what
        follows is text."""
        out.append(self._raw if not self.calls else self._block)
        self._block = self._raw = ""
        self._state = _PLAIN


def _may_begin(text: str, markers: tuple[str, ...]) -> bool:
    """`text` is empty or a proper start of one of `markers` (more may make it whole)."""
    return any(m.startswith(text) for m in markers)
