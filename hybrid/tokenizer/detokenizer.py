"""Turn a growing list of token ids into text deltas, never splitting a UTF-8 character."""

from __future__ import annotations

import codecs

from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer


class IncrementalDetokenizer:
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
