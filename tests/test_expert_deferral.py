"""Expert deferral through the engine (the experts' `defer_experts`, on the CPU): decode rows
defer, prompt rows do not; a row's result does not depend on its batch; beside GPU-held experts
(`gpu_experts`) a row defers among its CPU experts only; bad settings fail at build naming the
fix; `rules explain` says it is on. The drivers' protocol itself is checked in
tests/cpu_kernels/test_deferral.py, and a whole-step graph against the pieces in
tests/gpu_kernels/test_whole_step.py."""

from __future__ import annotations

import json

import pytest
import yaml

from cli.main import main
from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.errors import HybridError
from hybrid.rules.planner import plan_model, with_deferral
from hybrid.tuning.rules_writer import hot_expert_rules, write_rules

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]
CONTINUATION = [32, 38, 46, 26, 43, 38, 32, 79]


@pytest.fixture(scope="module")
def tiny(models):
    return str(models.path("tiny-v3", "q4_k_m", "legacy"))


def _llm(path, k, tmp_path, batch=2, rules=None):
    return LLM(path, str(rules or with_deferral("cpu", k, tmp_path)),
               engine_config=EngineConfig(max_batch_size=batch, cache_lens=512, page_size=16,
                                          chunk_size=16))


def _held_rules(path, k, held, tmp_path):
    """cpu.yaml deferring k experts, with experts `held` of every MoE layer on gpu_device cpu,
    written as `hybrid tune` writes hot experts: the base's defer_experts stays."""
    base = with_deferral("cpu", k, tmp_path)
    plan = plan_model(path, str(base), check_devices=False, announce=False).plan
    layers = [int(n.split(".")[2]) for n in plan.placements if n.endswith(".mlp.experts")]
    rules = hot_expert_rules(plan, {layer: held for layer in layers}, "cpu")
    assert [r["replace"]["kwargs"].get("defer_experts", 0) for r in rules] == [k] * len(layers)
    return write_rules(base, rules, tmp_path / f"held-defer{k}-{len(held)}.yaml", "held")


def _scored(llm, prompts):
    params = SamplingParams(temperature=0, max_tokens=len(CONTINUATION), logprobs=0,
                            forced_ids=tuple(CONTINUATION))
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    for o in outs:
        assert o.outputs[0].token_ids == CONTINUATION  # forced
    return [o.outputs[0].logprobs for o in outs]


def test_decode_rows_defer_and_prompt_rows_do_not(tiny, tmp_path):
    exact = _scored(_llm(tiny, 0, tmp_path), [PROMPT])[0]
    deferred = _scored(_llm(tiny, 1, tmp_path), [PROMPT])[0]
    # the first token comes from the prompt's last row: exact either way
    assert deferred[0] == exact[0]
    # then every token is decoded: deferral changes each one's distribution a little
    diffs = [abs(a - b) for a, b in zip(exact[1:], deferred[1:])]
    assert all(d > 0 for d in diffs) and max(diffs) < 5.0


def test_a_rows_result_does_not_depend_on_its_batch(tiny, tmp_path):
    llm = _llm(tiny, 2, tmp_path)
    alone = _scored(llm, [PROMPT])[0]
    # beside a longer prompt, whose chunks share steps with this request's decodes
    long_prompt = [(7 * i) % 200 + 3 for i in range(60)]
    beside = _scored(llm, [PROMPT, long_prompt])[0]
    assert beside == pytest.approx(alone, abs=1e-4)


def test_with_every_expert_held_there_is_nothing_to_defer(tiny, tmp_path):
    every = list(range(16))  # tiny-v3's routed experts
    exact = _scored(_llm(tiny, 0, tmp_path, rules=_held_rules(tiny, 0, every, tmp_path)),
                    [PROMPT])[0]
    deferring = _scored(_llm(tiny, 1, tmp_path, rules=_held_rules(tiny, 1, every, tmp_path)),
                        [PROMPT])[0]
    # the host gets only -1 slots: nothing now, nothing deferred, the held experts' sum alone
    assert deferring == exact


def test_beside_held_experts_decode_rows_defer_their_cpu_experts(tiny, tmp_path):
    half = list(range(8))
    exact = _scored(_llm(tiny, 0, tmp_path, rules=_held_rules(tiny, 0, half, tmp_path)),
                    [PROMPT])[0]
    llm = _llm(tiny, 1, tmp_path, rules=_held_rules(tiny, 1, half, tmp_path))
    assert all(layer.mlp.experts.gpu_experts is not None and layer.mlp.experts.defer_experts == 1
               for layer in llm.loaded.model.model.layers[1:])
    deferred = _scored(llm, [PROMPT])[0]
    assert deferred[0] == exact[0]  # from the prompt's last row
    diffs = [abs(a - b) for a, b in zip(exact[1:], deferred[1:])]
    assert all(d > 0 for d in diffs) and max(diffs) < 5.0
    long_prompt = [(7 * i) % 200 + 3 for i in range(60)]
    beside = _scored(llm, [PROMPT, long_prompt])[0]
    assert beside == pytest.approx(deferred, abs=1e-4)


@pytest.mark.parametrize("kwargs,match", [
    ({"defer_experts": 4}, "between 0 and 3"),
    ({"defer_experts": -1}, "between 0 and 3"),
])
def test_bad_settings_fail_naming_the_fix(tiny, tmp_path, kwargs, match):
    rules = yaml.safe_load(with_deferral("cpu", 0, tmp_path).read_text())
    for rule in rules:
        if rule["replace"]["class"] == "experts":
            rule["replace"]["kwargs"].update(kwargs)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(rules))
    with pytest.raises(HybridError, match=match):
        LLM(tiny, str(path), engine_config=EngineConfig(max_batch_size=1, cache_lens=128))


def test_explain_says_deferral_is_on(tiny, tmp_path, capsys):
    rules = str(with_deferral("cpu", 2, tmp_path))
    assert main(["rules", "explain", "--gguf-path", tiny, "--optimize-rules", rules,
                 "--cpu-memory", "8GiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deferred_experts"] == {"2": 2}  # tiny-v3's three MoE layers, the last not
    main(["rules", "explain", "--gguf-path", tiny, "--optimize-rules", rules,
          "--cpu-memory", "8GiB"])
    assert "expert deferral: 2 MoE layers defer the 2 lowest-weighted" in capsys.readouterr().out


def test_a_model_on_transformers_forward_refuses_it(models, tmp_path):
    """DeepSeek-V4 runs through transformers' forward (TransformersRunner), where no driver
    of ours carries a deferred sum: the rule is refused at start, not ignored."""
    path = str(models.path("tiny-v4", "mxfp4_moe"))  # experts our CPU kernels run
    rules = with_deferral("DeepSeek-V4-cpu", 1, tmp_path)
    with pytest.raises(HybridError, match="transformers' forward"):
        LLM(path, str(rules), engine_config=EngineConfig(chunk_size=64, max_batch_size=2))
