"""Tokenization equals llama.cpp's on the same GGUF; the chat template renders as DeepSeek's."""

from __future__ import annotations

import pytest

from hybrid.gguf.reader import GGUFModelFile
from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer, IncrementalDetokenizer

TEXTS = [
    "Hello world",
    " leading space and  double  spaces",
    "The quick brown fox jumps over the lazy dog.\nNew line\n\n\tTabbed",
    "数学是科学的语言。你好，世界！",
    "日本語のテキストとカタカナ、ひらがな",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "1234567890 3.14159 1e-10 -42 1,000,000",
    "Emoji: 😀🎉👍🏽 and 🇯🇵 flags",
    "<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
    "<think>\nreasoning\n</think>\n\nanswer",
    "Mixed: café naïve résumé Ελληνικά русский العربية हिन्दी",
    "   ",
    "a",
    "<|EOT|> not special-looking <｜fim▁hole｜>",
]


@pytest.fixture(scope="module")
def deepseek_gguf(models) -> str:
    return str(models.path("tiny-v3", "q8_0", vocab="deepseek"))


@pytest.fixture(scope="module")
def ours(deepseek_gguf) -> GGUFTokenizer:
    return GGUFTokenizer(GGUFModelFile(deepseek_gguf).metadata)


def test_vocabulary_is_deepseeks(ours: GGUFTokenizer) -> None:
    assert ours.vocab_size == 129280
    assert ours.bos_token_id == 0 and ours.eos_token_id == 1
    assert ours.encode("<｜User｜>", add_bos=False) == [128803]


@pytest.mark.parametrize("special", [True, False])
def test_matches_llama_cpp(deepseek_gguf: str, ours: GGUFTokenizer, special: bool) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=deepseek_gguf, vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            expected = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
            assert ours.encode(text, parse_special=special) == expected, text
    finally:
        llm.close()


def test_decode_round_trip(ours: GGUFTokenizer) -> None:
    for text in TEXTS:
        ids = ours.encode(text, add_bos=False, parse_special=False)
        assert ours.decode(ids) == text


def test_incremental_detokenizer_never_splits_characters(ours: GGUFTokenizer) -> None:
    text = "😀🎉 数学 café"
    detok = IncrementalDetokenizer(ours)
    deltas = [detok.push(i) for i in ours.encode(text, add_bos=False)]
    assert "".join(deltas) + detok.flush() == text
    assert all("\ufffd" not in d for d in deltas)


def test_chat_template(ours: GGUFTokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>hmm</think>Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = ours.apply_chat_template(messages)
    assert text == ("<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜>Hello!"
                    "<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜>")
    ids = ours.encode_chat(messages)
    assert ids[0] == 0 and ids.count(0) == 1 and ids[-1] == 128804


def test_detokenizer_ends_a_cut_character_at_a_skipped_special_token(ours) -> None:
    """A character cut short by a special token ends there (as U+FFFD), so text read beside
    the special tokens keeps their order."""
    special = ours.single_token("</think>")
    cut = next(i for i in range(ours.vocab_size) if ours.decode_bytes([i]) == b"\xe2")
    d = IncrementalDetokenizer(ours)
    pieces = [d.push(cut), d.push(special), d.push(ours.encode("a", add_bos=False)[0])]
    assert pieces == ["", "\ufffd", "a"]
