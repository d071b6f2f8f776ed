"""Structured output: every constrained output parses and validates against its schema, in
batches mixing requests with and without grammars; free-text requests are unaffected."""

from __future__ import annotations

import json

import jsonschema
import pytest

from hybrid.engine.llm import LLM
from hybrid.engine.sampling.grammar import json_grammar
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.errors import RequestRejected

SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "admin": {"type": "boolean"}},
     "required": ["name", "age", "admin"], "additionalProperties": False},
    {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        # numbers: bounded integers (a random model given "number" writes decimals forever)
        "scores": {"type": "array", "items": {"type": "integer", "minimum": -10, "maximum": 10},
                   "minItems": 1, "maxItems": 4}},
     "required": ["color", "scores"], "additionalProperties": False},
    {"type": "object", "properties": {
        "user": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "roles": {"type": "array", "items": {"enum": ["r", "w", "x"]}, "maxItems": 3}},
            "required": ["id", "roles"], "additionalProperties": False},
        "ok": {"type": "boolean"}},
     "required": ["user", "ok"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 5},
]


@pytest.fixture(scope="module")
def llm(models) -> LLM:
    return LLM(str(models.path("tiny-v3", "q4_k_m", vocab="deepseek")), "cpu")


def test_outputs_validate_in_a_mixed_batch(llm: LLM) -> None:
    prompts, params = [], []
    for i, schema in enumerate(SCHEMAS):
        for seed in range(3):
            prompts.append([0, 100 + i, 200 + seed])
            params.append(SamplingParams(temperature=1.0, seed=seed, max_tokens=200,
                                         grammar=json_grammar(schema)))
    free = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts += [[0, 7, 8, 9], [0, 11]]
    params += [free, free]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    for k, out in enumerate(outs[:-2]):
        text, schema = out.outputs[0].text, SCHEMAS[k // 3]
        assert out.outputs[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), schema)
    alone = llm.generate(prompt_token_ids=prompts[-2:], sampling_params=free)
    assert [o.outputs[0].token_ids for o in outs[-2:]] == [o.outputs[0].token_ids for o in alone]


def test_any_json_object(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=300, grammar=json_grammar(None))
    outs = llm.generate(prompt_token_ids=[[0, 5], [0, 6], [0, 7]], sampling_params=params)
    for out in outs:
        if out.outputs[0].finish_reason == "stop":  # a random model may ramble past 300
            assert isinstance(json.loads(out.outputs[0].text), dict)
        else:
            assert out.outputs[0].text.startswith("{")


def test_a_broken_schema_is_refused_in_one_line() -> None:
    with pytest.raises(RequestRejected, match="the JSON schema cannot be used") as e:
        json_grammar({"type": "object", "properties": {"a": {"type": "string",
                                                             "pattern": "(["}}})
    assert "\n" not in str(e.value)


def test_objects_are_closed_unless_the_schema_opens_them() -> None:
    from hybrid.engine.sampling.grammar import closed_objects

    schema = {"type": "object", "properties": {
        "zone": {"type": "string"},
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "free": {"type": "object"},  # no properties: any object, as written
        "open": {"type": "object", "properties": {"y": {}}, "additionalProperties": True},
        "list": {"type": "array", "items": {"properties": {"z": {}}}}},
        "$defs": {"p": {"properties": {"q": {}}}},
        "allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["properties"]["additionalProperties"] is False  # a key named "properties"
    assert "additionalProperties" not in props["properties"]["properties"]  # its map untouched
    assert "additionalProperties" not in props["free"]
    assert props["open"]["additionalProperties"] is True
    assert props["list"]["items"]["additionalProperties"] is False
    assert closed["$defs"]["p"]["additionalProperties"] is False
    assert all("additionalProperties" not in s for s in closed["allOf"])  # parts of one object
    assert "additionalProperties" not in schema  # the caller's schema is not changed


def test_a_schema_without_additional_properties_takes_no_invented_key(llm: LLM) -> None:
    """The grammar accepts the listed key and refuses another, unless lenient."""
    tok = llm.tokenizer
    vocab = llm.engine.outputs.grammar_vocab
    schema = {"type": "object", "properties": {"zone": {"type": "string"}}}

    def takes(text: str, lenient: bool) -> bool:
        m = vocab.matcher(json_grammar(schema, lenient=lenient))
        return all(m.accept(t) for t in tok.encode(text, add_bos=False))

    assert takes('{"zone": "a"}', lenient=False)
    assert not takes('{"zone": "a", "extra": 1}', lenient=False)
    assert takes('{"zone": "a", "extra": 1}', lenient=True)


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100, 1000])
def test_apply_bitmask_keeps_the_tokens_whose_bits_are_set(vocab: int) -> None:
    """Token t of a row is kept iff bit t % 32 of word t // 32 is set (llguidance's layout),
    every bit of a word, the sign bit and a last partial word included."""
    import torch

    from hybrid.engine.sampling.grammar import apply_bitmask

    g = torch.Generator().manual_seed(vocab)
    bits = torch.randint(-2**31, 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32,
                         generator=g)
    bits[0] = -1  # every token kept
    logits = torch.randn(3, vocab, generator=g)
    got = logits.clone()
    apply_bitmask(got, bits)
    want = [[logits[r, t].item() if (int(bits[r, t // 32]) >> (t % 32)) & 1 else float("-inf")
             for t in range(vocab)] for r in range(3)]
    assert got.tolist() == want


def test_a_matcher_made_on_one_thread_masks_on_another(llm: LLM) -> None:
    """On a GPU a step launched ahead masks its grammar rows on the whole-step graph's beside
    thread, after the engine's thread made the matcher and fed it the step before's token."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from hybrid.engine.sampling.grammar import mask_logits

    tok = llm.tokenizer
    m = llm.engine.outputs.grammar_vocab.matcher(json_grammar(None))
    assert all(m.accept(t) for t in tok.encode("{", add_bos=False))
    logits = torch.zeros(1, llm.loaded.spec.vocab_size)
    with ThreadPoolExecutor(1) as beside:
        beside.submit(mask_logits, logits, [m]).result()
    kept = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert 0 < len(kept) < logits.shape[1]
    assert m.accept(kept[0])  # the engine's thread goes on with a token the mask kept


def test_bench_grammar_times_both_batches(models) -> None:
    """scripts/bench_grammar.py at a CPU size prints its row: the free and the constrained
    decode step and the masks alone, at the overlap it was given."""
    import subprocess
    import sys
    from pathlib import Path

    from .subprocess_env import with_checkout

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "scripts/bench_grammar.py", "--gguf-path",
         str(models.path("tiny-v3", "q4_k_m", vocab="deepseek")), "--optimize-rules", "cpu",
         "--batch", "2", "--steps", "3", "--overlap-decode", "on"],
        cwd=root, env=with_checkout(root), check=True, capture_output=True,
        text=True, timeout=600).stdout
    assert "overlap_decode=on" in out
    row = out.strip().splitlines()[-1].split("|")[1:-1]  # tokens, free, constrained, +%, masks
    assert row[0].strip() == "129280 tokens" and all(float(row[i]) > 0 for i in (1, 2, 4))
