"""The `prompt_products` rule option reaches the GPU kernels: by default every quantized matrix
of the attention, MLP and head operators multiplies long prompts in fp16 (GpuQuant.fp16_prompts),
`prompt_products: fp32` keeps an operator's in fp32, and a dense MLP over a long prompt gives
the same rows both ways to fp16's rounding (devices mapped to the CPU, gpu_kernels in Triton's
interpreter)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import yaml

from gpu_kernels.dequant_rows import SCRATCH_MIN_TOKENS
from hybrid.ops.weights import Weight
from hybrid.rules.inject import inject
from hybrid.rules.planner import find_rules, plan_model
from tests.gpu_kernels.conftest import rel_err


def _model(models, rules: str, monkeypatch):
    monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    return inject(plan_model(str(models.path("tiny-v3", "q4_k_m")), rules,
                             device_map={"cuda": "cpu"}, announce=False))


def _flags(module) -> set[bool]:
    return {q.fp16_prompts for w in vars(module).values() if isinstance(w, Weight)
            for q in (w.quant or ())}


def test_default_fp16_and_fp32_by_rule(models, monkeypatch, tmp_path) -> None:
    model = _model(models, "DeepSeek-V3", monkeypatch)
    attn, mlp = model.get_submodule("model.layers.0.self_attn"), model.get_submodule(
        "model.layers.0.mlp")
    assert _flags(attn) == {True} and _flags(mlp) == {True}
    rules = yaml.safe_load(find_rules("DeepSeek-V3").read_text())
    for rule in rules:
        if rule["replace"].get("class") == "mla_attention":
            rule["replace"].setdefault("kwargs", {})["prompt_products"] = "fp32"
    path = tmp_path / "fp32-attention.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    exact = _model(models, str(path), monkeypatch)
    assert _flags(exact.get_submodule("model.layers.0.self_attn")) == {False}
    assert _flags(exact.get_submodule("model.layers.0.mlp")) == {True}

    # layer 0's dense MLP over a prompt long enough for the scratch path, fp16 then fp32
    x = torch.randn(SCRATCH_MIN_TOKENS + 3, model.config.hidden_size,
                    generator=torch.Generator().manual_seed(0))  # [T, H]
    fp16 = mlp(x)
    for w in vars(mlp).values():
        if isinstance(w, Weight):
            w._quant = tuple(replace(q, fp16_prompts=False) for q in w.quant)
    fp32 = mlp(x)
    assert rel_err(fp16, fp32) < 2e-3 and not torch.equal(fp16, fp32)


@pytest.mark.parametrize("bad", ["bf16", 16])
def test_a_bad_value_names_the_choices(bad, tmp_path) -> None:
    from hybrid.rules.schema import RuleError, parse_rules

    text = ("- match: {name: \"^model\\\\.layers\\\\.0\\\\.mlp$\"}\n"
            f"  replace: {{class: mlp, kwargs: {{prompt_products: {bad}}}}}\n")
    with pytest.raises(RuleError, match="prompt_products"):
        parse_rules(text, "bad.yaml")
