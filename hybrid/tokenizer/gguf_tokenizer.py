"""The tokenizer a GGUF file defines, built as a HF `tokenizers` BPE to tokenize as llama.cpp does.

GGUF stores a byte-level BPE (`tokenizer.ggml.model` = gpt2): token strings, merges, token
types and a named pre-tokenizer (`tokenizer.ggml.pre`). llama.cpp splits text with a fixed list
of regexes per pre-tokenizer name (pre_tokenizers.py) and treats CONTROL tokens as special (matched in text only
when special parsing is on) and USER_DEFINED tokens as always matched. We reproduce that here;
`tests/test_tokenizer.py` checks our ids against llama.cpp's on the same file.
`IncrementalDetokenizer` turns a request's growing token ids back into text deltas.
"""

from __future__ import annotations

import codecs
from functools import cached_property
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models

from hybrid.errors import GGUFError, shown
from hybrid.tokenizer.chat_template import ChatTemplate
from hybrid.tokenizer.pre_tokenizers import pre_tokenizer

# llama.cpp's token types.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6



class GGUFTokenizer:
    """Encode/decode exactly as the GGUF's tokenizer; render its chat template."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise GGUFError(
                f"tokenizer.ggml.model is '{shown(model)}'; hybrid reads byte-level BPE ('gpt2') "
                "tokenizers, which every DeepSeek GGUF uses"
            )
        self.tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        merges = metadata.get("tokenizer.ggml.merges") or []
        types = metadata.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(self.tokens)
        self.token_types: list[int] = list(types)
        pre = metadata.get("tokenizer.ggml.pre")
        self.pre = None if pre is None else str(pre)
        self.bos_token_id: int | None = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_token_id: int | None = metadata.get("tokenizer.ggml.eos_token_id")
        self.add_bos: bool = bool(metadata.get("tokenizer.ggml.add_bos_token", True))
        self._tok = _build(self.tokens, merges, self.token_types, self.pre)
        self.chat_template = ChatTemplate(
            metadata.get("tokenizer.chat_template") or _family_template(metadata),
            bos_token=self.id_to_token(self.bos_token_id),
            eos_token=self.id_to_token(self.eos_token_id),
        )
        self.special_ids = frozenset(
            i for i, t in enumerate(self.token_types) if t in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_UNUSED)
        )

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def use_chat_template(self, source: str) -> None:
        """Render chats with `source` instead of the file's template (`--chat-template`)."""
        self.chat_template = ChatTemplate(source, self.chat_template.bos_token,
                                          self.chat_template.eos_token)

    def single_token(self, text: str) -> int | None:
        """The id of the one special (control or user-defined) token whose text is `text`, e.g. a
        tool-call marker; None if no special token spells it."""
        return self._special_by_text.get(text)

    @cached_property
    def _special_by_text(self) -> dict[str, int]:
        return {self.tokens[i]: i for i, t in enumerate(self.token_types)
                if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED)}

    def id_to_token(self, token_id: int | None) -> str:
        return "" if token_id is None else self.tokens[token_id]

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; a BOS is prepended when the model asks for it (`add_bos`)."""
        if parse_special:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        else:
            ids = self._encode_plain(text)
        add = self.add_bos if add_bos is None else add_bos
        if add and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        # Control tokens are plain text here: run the pre-tokenizer and BPE, no added tokens.
        ids: list[int] = []
        for piece, _ in self._tok.pre_tokenizer.pre_tokenize_str(text):
            ids.extend(t.id for t in self._tok.model.tokenize(piece))
        return ids

    def hf_json(self) -> str:
        """The tokenizer as a HF `tokenizers` JSON document (what grammar engines read)."""
        return self._tok.to_str()

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def decode_bytes(self, ids: list[int]) -> bytes:
        """The exact bytes of `ids` (may end inside a UTF-8 character; streaming needs that)."""
        out = bytearray()
        for i in ids:
            tok = self.tokens[i]
            if self.token_types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
                out += tok.encode("utf-8")
            else:
                out += _token_bytes(tok)
        return bytes(out)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **kwargs: Any) -> list[int]:
        """Render the chat template and tokenize it (the template writes its own BOS)."""
        text = self.apply_chat_template(messages, add_generation_prompt, **kwargs)
        bos = self.id_to_token(self.bos_token_id)
        return self.encode(text, add_bos=not (bos and text.startswith(bos)))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def _token_bytes(token: str) -> bytes:
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def _build(tokens: list[str], merges: list[str], types: list[int], pre: str | None) -> Tokenizer:
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if sep:
            pairs.append((a, b))
    split = pre_tokenizer(pre)
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                     ignore_merges=split.ignore_merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = split.build()
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == TOKEN_CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    return tok


def _family_template(metadata) -> str | None:
    """For a file without a chat template: DeepSeek-V3.2's or V4's (their models ship none, so
    their conversions carry none) for a `deepseek32` or `deepseek4` file; None (DeepSeek-V3's
    format) otherwise."""
    name = {"deepseek32": "deepseek-v3.2", "deepseek4": "deepseek-v4"}.get(
        metadata.get("general.architecture"))
    if name is None:
        return None
    from hybrid.tokenizer.bundled_templates import bundled_template

    return bundled_template(name)


class IncrementalDetokenizer:
    """Turn a growing list of token ids into text deltas, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: GGUFTokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (may be "" mid-character)."""
        if self.skip_special_tokens and token_id in self.tokenizer.special_ids:
            # a character cut short by a special token ends here, as "\ufffd", so the text
            # keeps the tokens' order (a reader putting the token's text back sees it after)
            delta = self._decoder.decode(b"", final=True)
            self._decoder.reset()
            self.text += delta
            return delta
        delta = self._decoder.decode(self.tokenizer.decode_bytes([token_id]))
        self.text += delta
        return delta

    def flush(self) -> str:
        delta = self._decoder.decode(b"", final=True)
        self.text += delta
        return delta
