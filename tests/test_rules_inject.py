"""Acceptance: every bundled rule file, with GPU devices mapped to the CPU, gives the
foundation model's logits (relative L2 <= 1e-5); operators land where the plan says."""

from __future__ import annotations

import pytest
import torch

from hybrid.engine.llm import LLM
from hybrid.engine.sampling_params import SamplingParams
from hybrid.model.loader import load_model
from hybrid.rules.engine import plan_model
from hybrid.rules.inject import inject

from .oracles import rel_l2

PROMPT = [0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223]
CASES = [
    ("tiny-v3", rules, quant, layout)
    for rules in ("cpu.yaml", "DeepSeek-V3.yaml", "DeepSeek-V3-multi-gpu.yaml",
                  "DeepSeek-V3-gpu-experts.yaml")
    for quant, layout in (("q4_k_m", "legacy"), ("f32", "mla"))
] + [
    ("tiny-v2-lite", rules, quant, layout)
    for rules in ("cpu.yaml", "DeepSeek-V2-Lite.yaml")
    for quant, layout in (("q4_k_m", "mla"), ("q8_0", "legacy"))
]


@pytest.mark.parametrize("preset,rules,quant,layout", CASES)
def test_bundled_rules_equal_the_foundation_model(models, preset, rules, quant, layout) -> None:
    path = str(models.path(preset, quant, layout))
    reference = load_model(path).model
    planned = plan_model(path, rules, device_map={"cuda": "cpu"}, announce=False)
    model = inject(planned)
    with torch.inference_mode():
        expected = reference(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
        ours = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    assert rel_l2(ours, expected) <= 1e-5
    ops = {type(m).__name__ for m in model.modules()}
    assert {"MLAAttentionOp", "ExpertsOp", "GateOp", "MLPOp", "RMSNormOp", "EmbeddingOp",
            "RotaryOp", "LinearOp"} <= ops


def test_cpu_rules_decode_matches_the_reference(models) -> None:
    """Prefill + token-by-token decode through the latent cache gives the reference's tokens."""
    path = str(models.path("tiny-v3", "q4_k_m", "mla"))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    ours = LLM(path, "cpu.yaml").generate(prompt_token_ids=[PROMPT], sampling_params=params)
    reference = load_model(path).model
    ids, expected = list(PROMPT), []
    with torch.inference_mode():
        for _ in range(12):
            nxt = int(reference(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            expected.append(nxt)
            ids.append(nxt)
    assert ours[0].outputs[0].token_ids == expected


def test_experts_stay_in_gguf_blocks_on_cpu(models) -> None:
    planned = plan_model(str(models.path("tiny-v3", "q4_k_m")), "cpu.yaml", announce=False)
    model = inject(planned)
    experts = model.get_submodule("model.layers.1.mlp.experts")
    assert experts.backend == "cpu"
    gate = experts.cpu_weights.gate
    assert gate.blocks.dtype.name == "uint8"  # raw Q4_K blocks, not a dequantized copy
    assert gate.blocks.nbytes == planned.gguf.tensor("blk.1.ffn_gate_exps.weight").nbytes
