"""Split a streamed reply into answer text and tool calls, in one family's format.

Fed text deltas (with the markers' control tokens put back as text), it returns the answer text
that is sure to be text and the calls as they form: a call's first delta carries its id and
function name as soon as its header is whole, then its JSON arguments arrive in pieces. Text
that may still be a marker ("<｜tool", a closing "\\n``") is held back until it is whole or
proven not to be one, whatever the token boundaries.

Malformed output degrades to text, never to an error: a block that breaks the format before
its first call is complete (a header that names no function, a marker out of place) is given
back as the answer text, markers and all. Once a call has been sent it stays sent; what follows
a broken call is text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.reasoning import partial_suffix
from server.tools.formats import ToolFormat

_TEXT, _BETWEEN, _HEADER, _ARGS, _PLAIN = "text", "between", "header", "args", "plain"
MAX_HEADER_CHARS = 256  # a call header longer than this is not one


@dataclass(frozen=True)
class ToolCallDelta:
    index: int  # of the call in this reply
    id: str | None = None  # set on a call's first delta only, with its name
    name: str | None = None
    arguments: str = ""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""


@dataclass
class ToolCallParser:
    fmt: ToolFormat
    calls: list[ToolCall] = field(default_factory=list)
    _state: str = _TEXT
    _held: str = ""
    _raw: str = ""  # everything since the block opened, while no call has been sent

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        buf, self._held = self._held + text, ""
        out: list[str] = []
        deltas: list[ToolCallDelta] = []
        while buf:
            if self._state == _PLAIN:
                out.append(buf)
                break
            if self._state == _TEXT:
                buf = self._text(buf, out)
            elif self._state == _BETWEEN:
                buf = self._between(buf, out)
            elif self._state == _HEADER:
                buf = self._header(buf, out, deltas)
            else:
                buf = self._args(buf, deltas)
        return "".join(out), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """The held-back text once the reply has ended (cut short, or by its end token)."""
        held, self._held = self._held, ""
        if self._state == _TEXT:
            return held, []
        if self._state == _ARGS:  # cut short inside the arguments: they are what they are
            self.calls[-1].arguments += held
            return "", [ToolCallDelta(len(self.calls) - 1, arguments=held)] if held else []
        if not self.calls and self._state in (_BETWEEN, _HEADER):
            return self._raw + held, []  # a block with no whole call: it was text
        return "", []

    # -- states ----------------------------------------------------------------------------

    def _text(self, buf: str, out: list[str]) -> str:
        starts = [(buf.find(m), m) for m in (self.fmt.section_begin, self.fmt.call_begin)]
        found = [(i, m) for i, m in starts if i >= 0]
        if not found:
            keep = max(partial_suffix(buf, self.fmt.section_begin),
                       partial_suffix(buf, self.fmt.call_begin))
            out.append(buf[:len(buf) - keep])
            self._held = buf[len(buf) - keep:]
            return ""
        i, marker = min(found)
        out.append(buf[:i])
        self._raw = marker
        self._state = _BETWEEN if marker == self.fmt.section_begin else _HEADER
        return buf[i + len(marker):]

    def _between(self, buf: str, out: list[str]) -> str:
        stripped = buf.lstrip()
        for marker, state in ((self.fmt.call_begin, _HEADER), (self.fmt.section_end, _PLAIN)):
            if stripped.startswith(marker):
                self._note_raw(buf[:len(buf) - len(stripped) + len(marker)])
                self._state = state
                return stripped[len(marker):]
        if any(m.startswith(stripped) for m in (self.fmt.call_begin, self.fmt.section_end)):
            self._held = buf  # whitespace, or a marker's start: wait for more
            return ""
        return self._broken(buf, out)

    def _header(self, buf: str, out: list[str], deltas: list[ToolCallDelta]) -> str:
        end = buf.find(self.fmt.header_end)
        if end < 0:
            if len(buf) > MAX_HEADER_CHARS:
                return self._broken(buf, out)
            self._held = buf
            return ""
        header = buf[:end]
        name = self.fmt.name_of(header)
        if name is None:
            return self._broken(buf, out)
        call_id = self.fmt.new_call_id(header)
        self.calls.append(ToolCall(call_id, name))
        deltas.append(ToolCallDelta(len(self.calls) - 1, call_id, name))
        self._raw, self._state = "", _ARGS
        return buf[end + len(self.fmt.header_end):]

    def _args(self, buf: str, deltas: list[ToolCallDelta]) -> str:
        if not self.calls[-1].arguments:  # the fence's newline, or any space before the JSON
            buf = buf.lstrip()
            if not buf:
                return ""
        end = buf.find(self.fmt.call_end)
        if end >= 0:
            args, rest = buf[:end], buf[end + len(self.fmt.call_end):]
            args = _strip_closing(args, self.fmt.fenced)
            self._state = _BETWEEN
        else:
            keep = self._closing_suffix(buf)
            args, rest = buf[:len(buf) - keep], ""
            self._held = buf[len(buf) - keep:]
        if args:
            self.calls[-1].arguments += args
            deltas.append(ToolCallDelta(len(self.calls) - 1, arguments=args))
        return rest

    def _broken(self, buf: str, out: list[str]) -> str:
        """The block does not follow the format: before any call it was text; after one, what
        follows is text."""
        out.append((self._raw if not self.calls else "") + buf)
        self._raw, self._state = "", _PLAIN
        return ""

    def _note_raw(self, text: str) -> None:
        if not self.calls:
            self._raw += text

    def _closing_suffix(self, buf: str) -> int:
        """The length of the longest suffix of `buf` that may begin the end of the arguments:
        whitespace, the fence's ``` (fenced formats), then a prefix of the call's end marker."""
        for start in range(len(buf)):
            if _may_close(buf[start:], self.fmt.call_end, self.fmt.fenced):
                return len(buf) - start
        return 0


def _may_close(s: str, call_end: str, fenced: bool) -> bool:
    t = s.lstrip()
    if fenced:
        if t.startswith("```"):
            t = t[3:].lstrip()
        else:
            return "```".startswith(t)
    return call_end.startswith(t)


def _strip_closing(args: str, fenced: bool) -> str:
    args = args.rstrip()
    if fenced and args.endswith("```"):
        args = args[:-3].rstrip()
    return args

