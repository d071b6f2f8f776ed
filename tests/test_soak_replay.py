"""The soak's diagnosis of a greedy answer that differs between a batched run and a run alone:
where two answers part, and whether the token taken there was a near-tie."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from soak_replay import _first_text, _gap, _parting, _printable

# a run alone of three steps: its tokens and each step's reported candidates, best first
STEPS = [(b"He", [(b"He", -0.1), (b"Ha", -0.3)]),
         (b"llo", [(b"llo", -0.5), (b"y", -0.5004), (b"\xe4\xb8", -2.0)]),
         (b" world", [(b" world", -1.0), (b" there", -1.2)])]


def test_a_text_that_follows_the_run_is_no_gap() -> None:
    assert _gap(STEPS, "Hello world") == 0.0
    assert _gap(STEPS, "Hello") == 0.0  # ended first, as a stop string ends it


def test_a_text_that_parts_at_a_near_tie_gives_the_gap() -> None:
    assert abs(_gap(STEPS, "Hey there") - 0.0004) < 1e-9
    assert abs(_gap(STEPS, "Hello there") - 0.2) < 1e-9
    assert abs(_gap(STEPS, "He\u4e2d") - 1.5) < 1e-9  # a token of a character's first bytes


def test_a_token_outside_the_candidates_is_unexplained() -> None:
    assert _gap(STEPS, "Hellx") is None
    assert _gap(STEPS, "Zebra") is None


def test_invalid_bytes_compare_as_the_server_shows_them() -> None:
    """A random model writes tokens of stray UTF-8 bytes: the text shows each as U+FFFD."""
    steps = [(b"A", [(b"A", -0.1)]), (b"\xb8", [(b"\xb8", -0.1), (b"B", -0.15)]),
             (b"C", [(b"C", -0.2), (b"\xe4", -0.3)])]
    assert _gap(steps, "A\ufffdC") == 0.0
    assert abs(_gap(steps, "AB") - 0.05) < 1e-9
    assert abs(_gap(steps, "A\ufffd\u4e2d") - 0.1) < 1e-9  # a character's first byte
    assert _gap(steps, "A\ufffdX") is None


def test_special_tokens_are_not_in_the_text() -> None:
    """The server leaves special tokens out of the text (a random model writes DeepSeek's
    placeholders): the walk steps over them."""
    steps = [(b"A", [(b"A", -0.1)]), ("<｜place▁holder▁no▁440｜>".encode(), [(b"x", -0.1)]),
             (b"<|place_holder_mm_span_0260|>", [(b"y", -0.1)]), (b"C", [(b"C", -0.2)])]
    assert _gap(steps, "AC") == 0.0
    assert _gap(steps, "AZ") is None


def test_steps_kept_for_json() -> None:
    assert _printable([(b"\xe4", [(b"A", -0.123456)])]) == [("\\xe4", [("A", -0.12346)])]
    assert _printable(None) is None


def test_first_text_and_parting() -> None:
    assert _first_text([("content", "[]"), ("other", "[]")]) == "content"
    assert _first_text(["text"]) == "text" and _first_text(503) == 503
    assert _parting("Hello world", "Hello there") == "parted after 6 chars: 'world' != 'there'"
