"""DeepSeek R1's `<think>...</think>`: split generated text into reasoning and answer.

R1 writes its reasoning first, inside a think block, then the answer. Its newer chat template
(and `--force-think`) ends the prompt with "<think>\\n", so the output starts inside the block
and only `</think>` appears; older templates leave the model to open the block itself. The
parser works on text deltas as they stream: a tag split over several tokens ("</", "think",
">") is held back until it is whole or proven not to be a tag, so the two parts never leak
into each other, whatever the token boundaries.

When the tags are control tokens (the detokenizer skips them, as for our synthetic
vocabularies), `ThinkSetup.tag_text` lets the reply's reader put their text back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

THINK_START = "<think>"
THINK_END = "</think>"
THINK_PREFIX = THINK_START + "\n"  # what R1's template (and --force-think) ends the prompt with

_START, _THINK, _ANSWER = "start", "think", "answer"


def is_thinking_template(source: str) -> bool:
    """A chat template that mentions <think> belongs to a thinking model."""
    return THINK_START in source


def opens_think(prompt_text: str) -> bool:
    """The prompt ends inside a think block, so the output starts as reasoning."""
    return prompt_text.rstrip().endswith(THINK_START)


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Feed text deltas; get back (reasoning delta, content delta) pairs.

    `in_think`: the output starts inside the think block. Otherwise a block is recognised only
    at the very start of the output (after whitespace); anything else is all answer, untouched.
    Leading whitespace of the reasoning and of the answer after `</think>` is dropped.
    """

    def __init__(self, in_think: bool) -> None:
        self._state = _THINK if in_think else _START
        self._held = ""  # text that may still turn out to be (part of) a tag
        self._at_part_start = True  # strip whitespace until the part's first visible text
        self.saw_think = in_think  # a think block was (or is being) parsed

    def feed(self, text: str) -> tuple[str, str]:
        buf, self._held = self._held + text, ""
        if self._state == _START:
            stripped = buf.lstrip()
            if stripped.startswith(THINK_START):
                self._state, self.saw_think = _THINK, True
                buf = stripped[len(THINK_START):]
            elif THINK_START.startswith(stripped):
                self._held = buf  # "", "  " or "<thi": wait for more
                return "", ""
            else:
                self._state = _ANSWER
                self._at_part_start = False  # no block: the answer is passed through as is
                return "", buf
        if self._state == _THINK:
            buf = self._strip_lead(buf)
            end = buf.find(THINK_END)
            if end < 0:
                keep = partial_suffix(buf, THINK_END)
                self._held = buf[len(buf) - keep:]
                return buf[:len(buf) - keep], ""
            self._state, self._at_part_start = _ANSWER, True
            return buf[:end], self._strip_lead(buf[end + len(THINK_END):])
        return "", self._strip_lead(buf)

    def finish(self) -> tuple[str, str]:
        """The held-back text once the output has ended."""
        held, self._held = self._held, ""
        return (held, "") if self._state == _THINK else ("", held)

    def _strip_lead(self, text: str) -> str:
        if self._at_part_start:
            text = text.lstrip()
            self._at_part_start = not text
        return text


def parse_whole(text: str, in_think: bool) -> tuple[str, str]:
    """(reasoning, content) of a whole output."""
    parser = ReasoningParser(in_think)
    r1, c1 = parser.feed(text)
    r2, c2 = parser.finish()
    return r1 + r2, c1 + c2


@dataclass(frozen=True)
class ThinkSetup:
    """How one chat response splits reasoning from the answer."""

    in_think: bool
    tag_text: dict[int, str] = field(default_factory=dict)  # control tag id -> its text

    def parser(self) -> ReasoningParser:
        return ReasoningParser(self.in_think)


def think_tags(tokenizer: Any) -> dict[int, str]:
    """The tokenizer's <think> and </think> control tokens: id -> text."""
    tags = {}
    for tag in (THINK_START, THINK_END):
        ids = [i for i in tokenizer.special_ids if tokenizer.tokens[i] == tag]
        tags.update(dict.fromkeys(ids, tag))
    return tags
