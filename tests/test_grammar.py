"""Structured output: every constrained output parses and validates against its schema, in
batches mixing requests with and without grammars; free-text requests are unaffected."""

from __future__ import annotations

import json

import jsonschema
import pytest

from hybrid.engine.grammar import json_grammar
from hybrid.engine.llm import LLM
from hybrid.engine.sampling_params import SamplingParams
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
