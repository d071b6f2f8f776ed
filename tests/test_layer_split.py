"""A one-GPU rule file spread over GPUs by layer ranges (hybrid/rules/layer_split.py): where the
plan puts every module, the boundaries, the errors, and the same greedy tokens as the one-GPU
rules (GPUs stood in for by the CPU here; scripts/bench_two_gpus.py checks two real GPUs)."""

from __future__ import annotations

import pytest

from hybrid.errors import HybridError
from hybrid.rules.layer_split import even_boundaries, split_rules, write_split
from hybrid.rules.planner import plan_model, with_experts_mode


def test_even_boundaries_split_the_moe_layers() -> None:
    assert even_boundaries(61, 3, 2) == [32]  # V3: 58 MoE layers, 29 a GPU
    assert even_boundaries(4, 1, 2) == [2]  # tiny-v3: layers 1 | 2, 3
    assert even_boundaries(27, 1, 4) == [7, 14, 20]
    with pytest.raises(HybridError, match="cannot be split over 3 GPUs"):
        even_boundaries(4, 2, 3)


def test_split_places_each_range_on_its_gpu(models, tmp_path) -> None:
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    split = write_split(str(base), [2], ["cuda:0", "cuda:1"], 4, tmp_path)
    assert split.read_text().startswith("# DeepSeek-V3-exact.yaml over cuda:0, cuda:1")
    placed = plan_model(path, str(split), check_devices=False, announce=False).plan.placements
    device = {name: p.generate_device for name, p in placed.items()}
    for layer in range(4):
        want = "cuda:0" if layer < 2 else "cuda:1"
        for part in ("self_attn", "input_layernorm", "post_attention_layernorm"):
            assert device[f"model.layers.{layer}.{part}"] == want, (layer, part)
    for layer in (1, 2, 3):  # routed experts stay on the CPU, the router follows its layer
        assert device[f"model.layers.{layer}.mlp.experts"] == "cpu"
        assert device[f"model.layers.{layer}.mlp.gate"] == ("cuda:0" if layer < 2 else "cuda:1")
    assert device["model.embed_tokens"] == "cuda:0"
    assert device["model.norm"] == device["lm_head"] == "cuda:1"


def test_split_moves_hot_experts_with_their_layer() -> None:
    rule = {"match": {"name": r"^model\.layers\.3\.mlp\.experts$"},
            "replace": {"class": "experts", "kwargs": {"generate_device": "cpu",
                                                       "gpu_device": "cuda", "gpu_experts": [1]}}}
    cpu = {"match": {"class": "X"}, "replace": {"class": "experts",
                                                "kwargs": {"generate_device": "cpu"}}}
    out = split_rules([rule, cpu], [2], ["cuda:0", "cuda:1"], 4)
    assert [r["replace"]["kwargs"].get("gpu_device") for r in out] == ["cuda:1", "cuda", None]
    assert out[2] is cpu  # a rule on the CPU alone is kept as it is
    with pytest.raises(HybridError, match="must rise"):
        split_rules([rule], [4], ["cuda:0", "cuda:1"], 4)
    with pytest.raises(HybridError, match="need 2 devices"):
        split_rules([rule], [2], ["cuda:0"], 4)


def test_split_rules_serve_the_one_gpu_tokens(models, tmp_path) -> None:
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    split = write_split(str(base), [2], ["cuda:0", "cuda:1"], 4, tmp_path)
    prompts = [[0, 5, 9, 11, 300], [0, 17, 2, 90]]
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
    runs = [LLM(path, str(rules), device_map={"cuda": "cpu"}).generate(
        prompt_token_ids=prompts, sampling_params=params) for rules in (base, split)]
    for a, b in zip(*runs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == pytest.approx(b.outputs[0].logprobs, abs=1e-5)


def _program_on(path: str, rules: str, held: dict[int, str] | None = None,
                relabel: dict[str, str] | None = None):
    """The decoder program of `rules` loaded on the CPU, its operators then labelled with the
    devices the rules name (planning reads devices only; nothing runs): a two-GPU plan
    checked where there is no GPU. held: layer -> the device its held experts name;
    relabel: module path -> a device it is labelled with instead."""
    import torch

    from hybrid.engine.llm import LLM
    from hybrid.engine.step.decoder import DecoderProgram
    from hybrid.engine.step.experts_bridge import ExpertsBridge

    plan = plan_model(path, rules, check_devices=False, announce=False).plan
    model = LLM(path, rules, device_map={"cuda": "cpu"}).engine.runner.model
    for name, module in model.named_modules():
        if type(module).__module__.startswith("hybrid.ops") and hasattr(module, "device"):
            module.device = torch.device((relabel or {}).get(
                name, plan.placement_of(name).generate_device))
    for layer, device in (held or {}).items():
        model.model.layers[layer].mlp.experts.gpu_experts.device = torch.device(device)
    hf = model.config
    return DecoderProgram(model, ExpertsBridge(8, hf.hidden_size, hf.num_experts_per_tok,
                                               torch.device("cpu")))


def test_the_step_crosses_to_the_next_gpu_once(models, tmp_path) -> None:
    """Split at layer 2: piece 0 (embeddings .. layer 1's router) on cuda:0, then layer 1's
    shared expert on cuda:0, and its CPU experts' host piece moves the step to cuda:1, where
    every later piece runs; each piece on one GPU (captured there)."""
    import torch

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    program = _program_on(path, str(write_split(str(base), [2], ["cuda:0", "cuda:1"], 4,
                                                tmp_path)))
    gpu0, gpu1 = torch.device("cuda:0"), torch.device("cuda:1")
    assert program.devices == [gpu0, gpu1] and program.spans_devices
    assert [p.device for p in program.pieces if p.on_device] == [gpu0, gpu0] + [gpu1] * 5
    assert [k for k, p in enumerate(program.pieces) if p.cross is not None] == [3]
    assert program.pieces_on_one_device
    one = _program_on(path, str(base))  # one GPU: no crossing, no device guard
    assert one.devices == [gpu0] and not one.spans_devices
    assert all(p.cross is None for p in one.pieces)


def test_experts_held_on_another_gpu_mix_their_stretch(models, tmp_path) -> None:
    import yaml

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    split = write_split(str(base), [2], ["cuda:0", "cuda:1"], 4, tmp_path)
    hot = [{"match": {"name": r"^model\.layers\.2\.mlp\.experts$"},
            "replace": {"class": "experts", "kwargs": {
                "generate_device": "cpu", "prefill_device": "cpu", "backend": "cpu",
                "mode": "exact", "gpu_experts": [0, 1], "gpu_device": "cuda:0"}},
            "recursive": False}]
    rules = tmp_path / "hot-elsewhere.yaml"
    rules.write_text(yaml.safe_dump(hot + yaml.safe_load(split.read_text()), sort_keys=False))
    program = _program_on(path, str(rules), held={2: "cuda:0"})
    assert not program.pieces_on_one_device  # layer 2's stretch runs on both GPUs: eager


def test_a_router_on_another_gpu_mixes_its_stretch(models, tmp_path) -> None:

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    split = str(write_split(str(base), [2], ["cuda:0", "cuda:1"], 4, tmp_path))
    assert _program_on(path, split).pieces_on_one_device
    program = _program_on(path, split, relabel={"model.layers.3.mlp.gate": "cuda:0"})
    assert not program.pieces_on_one_device


def test_explain_points_an_idle_gpu_to_the_split(models, tmp_path) -> None:
    from hybrid.rules.explain import explain

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    budgets = {"cuda:0": 2 << 30, "cuda:1": 2 << 30}
    for rules, idle in ((base, True), (write_split(str(base), [2], ["cuda:0", "cuda:1"], 4,
                                                   tmp_path), False)):
        planned = plan_model(path, str(rules), check_devices=False, announce=False)
        advice = explain(planned.plan, planned.spec, 1024, budgets, None).advice
        assert any(a.startswith("cuda:1 has a budget but the rules place nothing") for a in
                   advice) == idle
