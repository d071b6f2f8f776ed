"""DeepSeek R1 `<think>` parsing: every split of the output into tokens gives the same
reasoning and answer as the whole text; chat responses (whole and streamed) carry them apart."""

from __future__ import annotations

import itertools

import pytest

from hybrid.engine.scheduling.request import TokenOutput
from server.openai_format import ChatFormat
from server.reasoning import (
    ReasoningParser,
    ThinkSetup,
    is_thinking_template,
    opens_think,
    parse_whole,
    think_tags,
)

# (output, starts inside the think block, want reasoning, want answer)
CASES = [
    ("<think>\nLet me see.\n</think>\n\nIt is 4.", False, "Let me see.\n", "It is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("Let me see.\n</think>\n\nIt is 4.", True, "Let me see.\n", "It is 4."),
    ("\nstill thinking </thin", True, "still thinking </thin", ""),  # cut off: all reasoning
    ("a < b </ c </think> x </think> y", True, "a < b </ c ", "x </think> y"),
    ("Hello <think>no</think>", False, "", "Hello <think>no</think>"),  # not at the start
    ("<thinking>", False, "", "<thinking>"),
    ("<thi", False, "", "<thi"),  # ended before a tag could complete
    ("", False, "", ""),
    ("  ", False, "", "  "),
    ("<think></think>", False, "", ""),
    ("</think>answer", True, "", "answer"),
    ("x<</think>>", True, "x<", ">"),
]


def splits(text: str, max_pieces: int = 3):
    """Every way to cut `text` into at most `max_pieces` non-empty pieces, and one per char."""
    n = len(text)
    for k in range(min(max_pieces, n + 1)):
        for cuts in itertools.combinations(range(1, n), k):
            bounds = (0, *cuts, n)
            yield [text[a:b] for a, b in itertools.pairwise(bounds)]
    yield list(text)


@pytest.mark.parametrize("case", CASES, ids=[repr(c[0])[:30] for c in CASES])
def test_every_token_split_gives_the_same_parts(case) -> None:
    text, in_think, reasoning, answer = case
    assert parse_whole(text, in_think) == (reasoning, answer)
    for pieces in splits(text):
        parser = ReasoningParser(in_think)
        got_r, got_c = "", ""
        for piece in pieces:
            r, c = parser.feed(piece)
            got_r, got_c = got_r + r, got_c + c
            # Nothing of a tag is ever sent: every prefix streamed is a prefix of the result.
            assert reasoning.startswith(got_r) and answer.startswith(got_c), pieces
        r, c = parser.finish()
        assert (got_r + r, got_c + c) == (reasoning, answer), pieces
        assert parser.saw_think == (in_think or text.lstrip().startswith("<think>"))


def test_thinking_template_and_prompt_detection() -> None:
    assert is_thinking_template("...{{'<｜Assistant｜><think>\\n'}}")
    assert not is_thinking_template("{% if '</think>' in c %}{% endif %}")  # V3 drops old thoughts
    assert opens_think("<｜Assistant｜><think>\n") and not opens_think("<｜Assistant｜>")


class _Tok:
    """The part of a tokenizer ThinkSetup and ChatFormat read."""

    tokens = ("a", "<think>", "</think>", "b")
    special_ids = frozenset({1, 2})

    def decode_bytes(self, ids: list[int]) -> bytes:
        return "".join(self.tokens[i] for i in ids).encode()


def _events(texts: list[tuple[int, str]]) -> list[TokenOutput]:
    last = len(texts) - 1
    return [TokenOutput(tid, text, -0.1, (), "stop" if i == last else None)
            for i, (tid, text) in enumerate(texts)]


def test_control_tag_tokens_are_put_back_and_split_whole_and_streamed() -> None:
    # The detokenizer skips control tokens: "</think>" arrives as id 2 with empty text.
    events = _events([(0, "why"), (0, " so"), (2, ""), (3, "\n\nbecause"), (3, ".")])
    think = ThinkSetup(True, think_tags(_Tok()))
    assert think.tag_text == {1: "<think>", 2: "</think>"}
    fmt = ChatFormat("id", "m", _Tok(), logprobs=False, think=think)
    whole = fmt.new_choice()
    for e in events:
        whole.add(e)
    message = fmt.response([whole], prompt_tokens=3)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("why so", "because.")
    streamed = fmt.new_choice()
    deltas = [fmt.chunk(0, streamed, e, streamed.add(e), 0)["choices"][0]["delta"] for e in events]
    assert deltas == [{"reasoning_content": "why"}, {"reasoning_content": " so"}, {},
                      {"content": "because"}, {"content": "."}]


def test_no_think_block_means_no_reasoning_field() -> None:
    fmt = ChatFormat("id", "m", _Tok(), logprobs=False, think=ThinkSetup(False, think_tags(_Tok())))
    choice = fmt.new_choice()
    for e in _events([(0, "plain"), (3, " answer")]):
        choice.add(e)
    message = fmt.response([choice], prompt_tokens=1)["choices"][0]["message"]
    assert message["content"] == "plain answer" and "reasoning_content" not in message
    opened = fmt.new_choice()  # an output that opens the block itself is split
    for e in _events([(1, ""), (0, "hm"), (2, ""), (3, "ok")]):
        opened.add(e)
    message = fmt.response([opened], prompt_tokens=1)["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("hm", "ok")
