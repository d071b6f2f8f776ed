"""Structured output: a request's grammar (a JSON schema, or any JSON object) masks the logits
of each step to the tokens that keep the output valid, through llguidance.

llguidance (Microsoft's Rust grammar engine, one wheel with no dependencies) was chosen over
xgrammar, which pulls in triton and transformers and a TVM runtime, and outlines-core, which
compiles a whole-vocabulary automaton per schema up front: llguidance computes each step's mask
lazily over a token trie (scripts/bench_grammar.py: 0.2 ms for 16 requests' masks over a 129K
vocabulary, and a decode step at batch 16 with and without grammars).

The vocabulary comes from the GGUF's own tokenizer (the `tokenizers` object GGUFTokenizer
builds), so masks are over exactly the ids the model samples. Requests carry the grammar as
text (SamplingParams.grammar, no torch there); the engine makes one matcher per request.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from hybrid.engine.device_values import on_device
from hybrid.errors import RequestRejected

# llguidance is imported where a grammar is first used: an engine that never sees one (and a
# machine without the package, such as the GPU machine's bare image) does not need it

# compact JSON: no free whitespace (a random or weak model would pad forever), ", " and ": "
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def json_grammar(schema: dict[str, Any] | None, lenient: bool = False) -> str:
    """The grammar text for output that is a JSON value of `schema`; None: any JSON object.
    Objects with `properties` and no word on other keys take no other keys unless `lenient`
    (`closed_objects`). RequestRejected (the server's 400) names what is wrong with a schema
    llguidance refuses."""
    import llguidance

    if schema is not None and not lenient:
        schema = closed_objects(schema)
    text = llguidance.LLMatcher.grammar_from_json_schema(
        schema if schema is not None else {"type": "object"}, defaults=JSON_OPTIONS)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
    if is_error:
        reason = " ".join(str(messages[0]).split())[:300]  # one line
        raise RequestRejected(f"the JSON schema cannot be used: {reason}; fix the schema")
    return text


# keywords whose value is a map of names to schemas, one schema, or a list of schemas
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else",
               "additionalProperties", "propertyNames", "unevaluatedItems",
               "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_OTHER_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def closed_objects(schema: Any, in_all_of: bool = False) -> Any:
    """A copy of `schema` where every object schema that lists `properties` and says nothing
    of other keys (additionalProperties, unevaluatedProperties, patternProperties) takes no
    other keys, as vLLM's and SGLang's grammar backends read schemas: JSON Schema allows any
    key there, and a model given that freedom invents keys. `{"type": "object"}` without
    properties stays any object; the
    members of an allOf stay open (each sees only part of the keys)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_objects(s) for name, s in value.items()}
        elif key in _SCHEMA_ONE or key in _SCHEMA_LISTS:
            out[key] = closed_objects(value)
        elif key == "allOf" and isinstance(value, list):
            out[key] = [closed_objects(s, in_all_of=True) for s in value]
        else:
            out[key] = value  # enum, const, default, examples...: values, not schemas
    if not in_all_of and isinstance(out.get("properties"), dict) \
            and not any(k in out for k in _OTHER_KEYS):
        out["additionalProperties"] = False
    return out


class GrammarVocab:
    """The tokenizer as llguidance sees it, built once per engine (~1 s for 129K tokens)."""

    def __init__(self, hf_tokenizer_json: str, vocab_size: int, eos_token_id: int | None) -> None:
        self._json, self.vocab_size, self._eos = hf_tokenizer_json, vocab_size, eos_token_id

    @cached_property
    def tokenizer(self):  # llguidance.LLTokenizer
        import llguidance

        return llguidance.LLTokenizer(self._json, n_vocab=self.vocab_size, eos_token=self._eos)

    def matcher(self, grammar: str) -> Matcher:
        import llguidance

        return Matcher(llguidance.LLMatcher(self.tokenizer, grammar))


class Matcher:
    """One request's position in its grammar."""

    def __init__(self, m) -> None:  # llguidance.LLMatcher
        self._m = m

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing more may be generated."""
        return self._m.is_stopped()

    def accept(self, token_id: int) -> bool:
        """Advance by the sampled token; False if the grammar cannot take it (never after a
        masked step, except the end-of-sequence token once complete)."""
        return self._m.consume_token(token_id)


def mask_logits(logits: torch.Tensor, matchers: list[Matcher | None]) -> None:
    """Set to -inf, in place, every logit row i's tokens that matchers[i] forbids (None: no
    grammar). logits: [R, V] on any device; the bitmask is built on the CPU (page-locked where
    CUDA is) and queued to the device with the row index: nothing here waits for the device,
    so a step launched ahead may decide a grammar's token too (launch_ahead.py's invariant)."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    import llguidance.torch as llg_torch

    bitmask = llg_torch.allocate_token_bitmask(len(rows), logits.shape[1])  # [G, W] int32
    for j, i in enumerate(rows):
        llg_torch.fill_next_token_bitmask(matchers[i]._m, bitmask, j)
    # from page-locked memory a copy is queued; the host allocator keeps the block until the
    # stream has read it
    bits = bitmask.to(logits.device, non_blocking=bitmask.is_pinned())
    with torch.inference_mode():  # the logits are the forward's inference tensor
        if len(rows) == logits.shape[0]:  # every row constrained: no gather, no scatter
            apply_bitmask(logits, bits)
            return
        at = on_device(rows, logits.device)  # [G]
        sub = logits.index_select(0, at)  # [G, V]
        apply_bitmask(sub, bits)
        logits.index_copy_(0, at, sub)


def apply_bitmask(logits: torch.Tensor, bits: torch.Tensor) -> None:
    """logits [G, V] float, in place: token t of row g is kept iff bit t % 32 of bits[g, t // 32]
    is set (llguidance's layout; bits [G, ceil(V / 32)] int32 on logits' device). Plain torch
    launches: llguidance's own apply is torch.compile'd, which compiles at a first grammar."""
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)  # [32]
    kept = ((bits[:, :, None] >> shifts) & 1).flatten(1)[:, :logits.shape[1]]  # [G, V]
    logits.masked_fill_(kept == 0, float("-inf"))


def schema_of(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's response_format -> the schema (None: any JSON object). Raises RequestRejected."""
    kind = response_format.get("type")
    if kind == "json_object":
        return None
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise RequestRejected("response_format json_schema needs a json_schema object with a "
                              "'schema' object")
    return spec.get("schema") or {}

