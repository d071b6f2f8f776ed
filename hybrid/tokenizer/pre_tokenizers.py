"""The pre-tokenizer a GGUF's `tokenizer.ggml.pre` names, as llama.cpp applies it.

llama.cpp splits text with a fixed list of regexes per name (pre_tokenizer_table.py, generated
from its source) before byte-level BPE; some names also turn on `ignore_merges` (a whole split
piece that is itself a token is taken as is, llama-3 style). We build the same with HF
`tokenizers`: one isolating Split per regex, in order, then the byte-level mapping.

Names llama.cpp gives a tokenizer that is not byte-level BPE (raw UTF-8 pieces, or spaces
escaped as U+2581 first) are refused with the reason; so are names llama.cpp does not know. A
missing name is llama.cpp's "default" (it warns; so do we). "gpt2", which older hybrid-written
files carry, reads as llama.cpp's "gpt-2".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

from hybrid.errors import GGUFError, shown
from hybrid.tokenizer.pre_tokenizer_table import NAMES, RAW_UTF8, REGEXES

_ALIASES = {"gpt2": "gpt-2"}
log = logging.getLogger(__name__)

# Some of llama.cpp's regexes are triggers for hand-written splitters (its unicode.cpp); these
# are the splitters' behaviour written as regexes. Kimi-K2's takes any run of non-Han letters as
# one piece (the tiktoken pattern it stands for would split "HelloWorld"; llama.cpp does not),
# with an optional leading non-letter and an English contraction, any case. AFMoE's (and Tiny
# Aya's digit rule) cuts a run of \p{N} into a 1-2 digit head and groups of 3.
_DIGIT_GROUPS = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
_SPLITTERS = {
    r"\p{Han}+": (r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+"
                  r"(?:'[sStTmMdD]|'(?:[rR][eE]|[vV][eE]|[lL][lL]))?|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    r"\p{AFMoE_digits}": _DIGIT_GROUPS,
    r"\d{1,3}(?=(?:\d{3})*\b)": _DIGIT_GROUPS,
}


@dataclass(frozen=True)
class PreTokenizer:
    name: str
    kind: str  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_*, without the prefix
    regexes: tuple[str, ...]
    ignore_merges: bool

    def build(self) -> pre_tokenizers.PreTokenizer:
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.regexes]
        return pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer for `tokenizer.ggml.pre` = `name` (None: the key is missing)."""
    if name is None:
        log.warning("the GGUF names no pre-tokenizer (tokenizer.ggml.pre); using llama.cpp's "
                    "'default' as llama.cpp does: tokens may differ from the model's own")
        name = "default"
    entry = NAMES.get(_ALIASES.get(name, name))
    if entry is None:
        some = ", ".join(n for n in NAMES if n.startswith(("deepseek", "kimi", "default")))
        raise GGUFError(f"tokenizer.ggml.pre '{shown(name)}' is not a pre-tokenizer llama.cpp "
                        f"knows ({len(NAMES)} names, such as {some}; the list is "
                        "hybrid/tokenizer/pre_tokenizer_table.py); re-convert the model with "
                        "a current convert_hf_to_gguf.py")
    kind, flags = entry
    if kind in RAW_UTF8 or flags.get("escape_whitespaces"):
        how = "splits raw UTF-8" if kind in RAW_UTF8 else "escapes spaces as U+2581 first"
        raise GGUFError(f"tokenizer.ggml.pre '{name}' ({kind}) {how}, not byte-level BPE; "
                        "hybrid runs the byte-level BPE tokenizers of DeepSeek-architecture "
                        "files")
    regexes = tuple(_SPLITTERS.get(r, r) for r in REGEXES[kind])
    return PreTokenizer(name, kind, regexes, bool(flags.get("ignore_merges")))
