"""Every `tokenizer.ggml.pre` name llama.cpp accepts for byte-level BPE tokenizes as llama.cpp
does (same vocabulary and merges, the name's regexes and flags), token for token."""

from __future__ import annotations

import pytest

from hybrid.errors import GGUFError
from hybrid.gguf.reader import GGUFModelFile
from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer
from hybrid.tokenizer.pre_tokenizer_table import NAMES, RAW_UTF8

from .gguf_edit import vocab_only
from .test_tokenizer import TEXTS

# strings where the names' regexes part ways: contractions, digit runs, punctuation runs,
# scripts, whitespace runs
EXTRA = [
    "I'm sure you'll see it's THEY'RE WE'VE I'D",
    "12345678901 1234 12 ١٢٣٤ ½",
    "hello!!! ... ??? (a)[b]{c} <tag/> a->b a=>b ::= @@",
    "  two  spaces   three\n\n\n  \t \r\n end ",
    "Ünïcödé ǅ ﬁ ｆｕｌｌ 한국어 ไทย עברית",
    "snake_case camelCase PascalCase kebab-case 3.14e-5 0x1F",
    "HelloWorld Kimi中文混合text I'M WE'LL it'S x'd 你好ABC (中)",
]
BYTE_LEVEL = [n for n, (kind, flags) in NAMES.items()
              if kind not in RAW_UTF8 and not flags.get("escape_whitespaces")]


@pytest.fixture(scope="module")
def source(models):
    return models.path("tiny-v3", "q8_0", vocab="deepseek")


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_name_tokenizes_as_llama_cpp(source, tmp_path, name: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    path = vocab_only(source, tmp_path / "vocab.gguf", {"tokenizer.ggml.pre": name})
    ours = GGUFTokenizer(GGUFModelFile(path).metadata)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    try:
        for text in TEXTS + EXTRA:
            for special in (True, False):
                expected = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
                got = ours.encode(text, add_bos=False, parse_special=special)
                assert got == expected, (name, text, special)
    finally:
        llm.close()


def test_names_that_are_not_byte_level_are_refused(source, tmp_path) -> None:
    refused = [n for n in NAMES if n not in BYTE_LEVEL]
    assert refused  # whitespace (raw UTF-8), gemma4 and sarvam-moe (U+2581 spaces)
    for name in refused:
        path = vocab_only(source, tmp_path / "vocab.gguf", {"tokenizer.ggml.pre": name})
        with pytest.raises(GGUFError, match="not byte-level BPE"):
            GGUFTokenizer(GGUFModelFile(path).metadata)


def test_unknown_name_is_refused_with_the_list(source, tmp_path) -> None:
    path = vocab_only(source, tmp_path / "vocab.gguf", {"tokenizer.ggml.pre": "no-such\x1b"})
    with pytest.raises(GGUFError, match=r"'no-such\\x1b' is not a pre-tokenizer llama.cpp knows"):
        GGUFTokenizer(GGUFModelFile(path).metadata)
