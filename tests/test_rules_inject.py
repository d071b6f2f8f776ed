"""Acceptance: every bundled rule file, with GPU devices mapped to the CPU and its CPU experts in
exact mode (the GPU files serve in fast mode), gives the foundation model's logits (relative
L2 <= 1e-5); operators land where the plan says."""

from __future__ import annotations

import pytest
import torch

from cpu_kernels.formats import qtypes
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.model.loader import load_model
from hybrid.rules.inject import inject
from hybrid.rules.planner import plan_model, with_experts_mode

from .oracles import rel_l2

PROMPT = [0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223]
CASES = [
    ("tiny-v3", rules, quant, layout)
    for rules in ("cpu.yaml", "DeepSeek-V3.yaml", "DeepSeek-V3-multi-gpu.yaml",
                  "DeepSeek-V3-gpu-experts.yaml")
    for quant, layout in (("q4_k_m", "legacy"), ("f32", "mla"))
] + [
    ("tiny-v2-lite", rules, quant, layout)
    for rules in ("cpu.yaml", "DeepSeek-V2-Lite.yaml", "DeepSeek-V2-Lite-gpu.yaml")
    for quant, layout in (("q4_k_m", "mla"), ("q8_0", "legacy"))
] + [  # V3.2 writes the MLA layout only; on the CPU mla_attention runs its indexer in torch
    ("tiny-v32", "DeepSeek-V3.2.yaml", quant, "mla") for quant in ("q4_k_m", "f32")
]


@pytest.mark.parametrize("preset,rules,quant,layout", CASES)
def test_bundled_rules_equal_the_foundation_model(models, preset, rules, quant, layout,
                                                  tmp_path) -> None:
    path = str(models.path(preset, quant, layout))
    reference = load_model(path).model
    exact = str(with_experts_mode(rules, "exact", tmp_path))
    planned = plan_model(path, exact, device_map={"cuda": "cpu"}, announce=False)
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


@pytest.mark.parametrize("quant, types", [("q4_k_m", ("Q4_K", "Q4_K")), ("q2_k", ("Q2_K", "Q3_K"))])
def test_experts_stay_in_gguf_blocks_on_cpu(models, quant: str, types: tuple[str, str]) -> None:
    planned = plan_model(str(models.path("tiny-v3", quant)), "cpu.yaml", announce=False)
    model = inject(planned)
    experts = model.get_submodule("model.layers.1.mlp.experts")
    assert experts.backend == "cpu"
    gate = experts.cpu_weights.gate
    assert gate.blocks.dtype.name == "uint8"  # raw blocks, not a dequantized copy
    w = experts.cpu_weights
    assert (qtypes.type_name(gate.qtype), qtypes.type_name(w.down.qtype)) == types
    assert gate.blocks.nbytes == planned.gguf.tensor("blk.1.ffn_gate_exps.weight").nbytes


def test_gpu_rule_files_serve_fast_experts(tmp_path) -> None:
    """The bundled GPU layouts run their CPU experts in fast mode; the derived copy in exact."""
    import yaml

    from hybrid.rules.planner import find_rules

    for name in ("DeepSeek-V3", "DeepSeek-V3.2", "DeepSeek-V2-Lite", "DeepSeek-V3-multi-gpu",
                 "DeepSeek-V3-gpu-experts"):
        for mode, path in (("fast", find_rules(name)),
                           ("exact", with_experts_mode(name, "exact", tmp_path))):
            rules = yaml.safe_load(path.read_text())
            modes = {r["replace"]["kwargs"].get("mode") for r in rules
                     if r["replace"]["class"] == "experts"
                     and r["replace"]["kwargs"].get("backend") == "cpu"}
            assert modes == {mode}, (name, modes)


def test_with_activations_sets_every_operator_that_takes_it(tmp_path) -> None:
    """A/B runs rewrite the products' activations; operators without the option keep theirs."""
    import yaml

    from hybrid.rules.planner import with_activations

    rules = yaml.safe_load(with_activations("DeepSeek-V3", "fp32", tmp_path).read_text())
    got = {r["replace"]["class"]: r["replace"].get("kwargs", {}).get("activations")
           for r in rules}
    assert got["mla_attention"] == got["mlp"] == got["lm_head"] == "fp32"
    assert got["experts"] is None and got["rmsnorm"] is None


@pytest.mark.parametrize("numa_nodes", [None, 2])
def test_experts_on_a_cpu_pool_equal_the_synchronous_kernels(models, numa_nodes) -> None:
    from cpu_kernels.runtime.pool import MoEPool
    from hybrid.ops.experts import use_cpu_pool

    model = inject(plan_model(str(models.path("tiny-v3", "q4_k_m")), "cpu.yaml", announce=False))
    experts = model.get_submodule("model.layers.1.mlp.experts")
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, experts.cpu_weights.hidden_size, generator=gen)
    ids = torch.stack([torch.randperm(experts.num_experts, generator=gen)[:4] for _ in range(5)])
    weights = torch.rand(5, 4, generator=gen)
    expected = experts(hidden, ids, weights)
    with MoEPool(threads=2, numa_nodes=numa_nodes) as pool:
        assert use_cpu_pool(model, pool) == 3  # the MoE layers 1..3 of tiny-v3
        got = experts(hidden, ids, weights)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
