"""GPU-held ("hot") experts overlap the CPU experts: the host's hand-over mark (the event its
CPU experts wait for; in a whole-step graph the ready flag) comes before their launches, so
the CPU never waits for them. Checked on an eager step with the GPU mapped onto the CPU. Held
experts in host memory (`gpu_experts_memory`, `pcie_experts`): the same math, the rule's
checks, and small steps left to the CPU."""

from __future__ import annotations

import pytest
import torch
import yaml

from hybrid.engine.config import EngineConfig
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.rules.planner import with_experts_mode, with_gpu_experts


def test_held_experts_launch_after_the_hand_over(models, tmp_path, monkeypatch) -> None:
    from hybrid.engine.llm import LLM
    from hybrid.engine.step.experts_bridge import ExpertsBridge
    from hybrid.ops.experts import ExpertsOp

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    hot = [{"match": {"name": r"^model\.layers\.\d+\.mlp\.experts$"},
            "replace": {"class": "experts", "kwargs": {
                "generate_device": "cpu", "prefill_device": "cpu", "backend": "cpu",
                "mode": "exact", "gpu_experts": [0, 1, 2], "gpu_device": "cuda:0"}},
            "recursive": False}]
    rules = tmp_path / "hot.yaml"
    rules.write_text(yaml.safe_dump(hot + yaml.safe_load(base.read_text()), sort_keys=False))
    llm = LLM(path, str(rules), device_map={"cuda": "cpu"},
              engine_config=EngineConfig(max_batch_size=2))
    order = []
    mark, run_held = ExpertsBridge.mark, ExpertsOp.run_held
    monkeypatch.setattr(ExpertsBridge, "mark",
                        lambda self, *a: order.append("mark") or mark(self, *a))
    monkeypatch.setattr(ExpertsOp, "run_held",
                        lambda self, *a: order.append("held") or run_held(self, *a))
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling_params=params)
    assert order.count("held") >= 3 * 3  # three steps, three MoE layers
    assert order == ["mark", "held"] * (len(order) // 2)  # each layer: hand-over, then held


def test_held_experts_in_host_memory_give_the_same_tokens(models, tmp_path) -> None:
    """`gpu_experts_memory: host` changes where the held experts' blocks lie, not the math:
    greedy tokens equal those of the same experts held in device memory, the logprobs within
    roundings (small steps leave host-memory experts to the CPU's kernels; here the GPU
    mapped onto the CPU; tests/gpu_kernels has the copy's own check)."""
    from hybrid.engine.llm import LLM
    from hybrid.ops.experts import ExpertsOp

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    got = {}
    for memory in ("device", "host"):
        (tmp_path / memory).mkdir()
        rules = with_gpu_experts("cpu", [1, 5, 9], memory, tmp_path / memory, device="cpu")
        llm = LLM(path, str(rules), engine_config=EngineConfig(max_batch_size=2))
        ops = [m for m in llm.engine.runner.model.modules() if isinstance(m, ExpertsOp)]
        assert ops and all(op.gpu_experts.memory == memory for op in ops)
        out = llm.generate(prompt_token_ids=[[5, 6, 7, 8], [9, 10]], sampling_params=params)
        got[memory] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in out]
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got["host"], got["device"]):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-4)


def test_held_experts_memory_is_device_or_host(models, tmp_path) -> None:
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    rules = with_gpu_experts("cpu", [1], "disk", tmp_path, device="cpu")
    with pytest.raises(Exception, match="gpu_experts_memory"):
        LLM(path, str(rules), engine_config=EngineConfig(max_batch_size=1))



def _pcie_rules(tmp_path, **kwargs):
    rules = [{"match": {"name": r"^model\.layers\.[0-9]+\.mlp\.experts$"},  # cpu.yaml's, shadowed
              "replace": {"class": "experts", "kwargs": {
                  "generate_device": "cpu", "backend": "cpu", "gpu_device": "cpu", **kwargs}},
              "recursive": False}]
    from hybrid.rules.planner import find_rules

    path = tmp_path / "pcie.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False) + find_rules("cpu").read_text())
    return str(path)


def test_pcie_experts_hold_a_spread_share_in_host_memory(models, tmp_path) -> None:
    from hybrid.rules.plan import pcie_expert_ids
    from hybrid.rules.planner import plan_model

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    plan = plan_model(path, _pcie_rules(tmp_path, pcie_experts=0.3), check_devices=False,
                      announce=False).plan
    experts = [p for p in plan.placements.values() if p.operator == "experts"]
    assert experts and all(p.options["gpu_experts"] == pcie_expert_ids(16, 0.3) ==
                           [0, 3, 6, 9, 12] and p.options["gpu_experts_memory"] == "host"
                           for p in experts)
    assert pcie_expert_ids(64, 0.3) == sorted(set(pcie_expert_ids(64, 0.3)))
    assert len(pcie_expert_ids(64, 0.3)) == 19 and len(pcie_expert_ids(8, 0.01)) == 1


def test_rule_editors_set_or_strip_the_bundled_share(tmp_path) -> None:
    """The bundled V2-Lite rules hold pcie_experts; a share of 0 strips it, another replaces
    it, and explicit gpu_experts replace it too (the plan refuses both on one rule)."""
    from hybrid.rules.planner import with_pcie_experts

    def experts(path):
        return [r["replace"]["kwargs"] for r in yaml.safe_load(path.read_text())
                if r["replace"].get("class") == "experts"]

    assert [k.get("pcie_experts") for k in experts(
        with_pcie_experts("DeepSeek-V2-Lite", 0, tmp_path))] == [None]
    assert [k.get("pcie_experts") for k in experts(
        with_pcie_experts("DeepSeek-V2-Lite", 0.15, tmp_path))] == [0.15]
    held = experts(with_gpu_experts("DeepSeek-V2-Lite", [1, 2], "host", tmp_path))
    assert held == [{**held[0], "gpu_experts": [1, 2]}] and "pcie_experts" not in held[0]


@pytest.mark.parametrize("kwargs,error", [
    ({"pcie_experts": 1.0}, "share in"), ({"pcie_experts": -0.2}, "share in"),
    ({"pcie_experts": 0.2, "gpu_experts": [1]}, "one of pcie_experts and gpu_experts"),
    ({"pcie_experts": 0.2, "backend": "torch"}, "needs backend cpu")])
def test_pcie_experts_refuse_what_cannot_hold(models, tmp_path, kwargs, error) -> None:
    from hybrid.errors import HybridError
    from hybrid.rules.planner import plan_model

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    with pytest.raises(HybridError, match=error):
        plan_model(path, _pcie_rules(tmp_path, **kwargs), check_devices=False, announce=False)


def test_small_steps_leave_host_memory_experts_to_the_cpu(models, tmp_path) -> None:
    """A step handing host-memory experts fewer than MIN_HOST_PAIRS pairs on average keeps
    them on the CPU (which holds every expert; `splits` says so, and a whole step's router
    then sends the rows itself); larger steps hand them over. The tokens are
    those of the CPU alone either way (greedy, within the products' roundings)."""
    from hybrid.engine.llm import LLM
    from hybrid.ops.experts import MIN_HOST_PAIRS, ExpertsOp

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    llm = LLM(path, _pcie_rules(tmp_path, pcie_experts=0.3, mode="exact"),
              engine_config=EngineConfig(max_batch_size=8))
    op = next(m for m in llm.engine.runner.model.modules() if isinstance(m, ExpertsOp))
    k, held = op.top_k, len(op.gpu_experts.slot)
    small = max(1, -(-MIN_HOST_PAIRS * op.num_experts // (k * held)) - 1)  # rows under the bar
    for rows, handed in ((small, False), (small + 1, True), (64, True)):
        ids = torch.arange(rows * k).reshape(rows, k) % op.num_experts
        host_ids, held_w = op.hand_off(ids, torch.ones(rows, k))
        assert (held_w is not None) == handed == op.splits(rows), rows
        assert torch.equal(host_ids == -1, op.gpu_held[ids] if handed else
                           torch.zeros_like(ids, dtype=torch.bool))
    cpu = LLM(path, "cpu", engine_config=EngineConfig(max_batch_size=8))
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompts = [list(range(5, 5 + n)) for n in (3, 17)]
    got = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts,
                                                       sampling_params=params)]
    want = [o.outputs[0].token_ids for o in cpu.generate(prompt_token_ids=prompts,
                                                        sampling_params=params)]
    assert got == want


def test_start_up_says_the_experts_are_in_host_memory(models, tmp_path) -> None:
    from hybrid.engine.llm import LLM

    lines = []
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    LLM(path, _pcie_rules(tmp_path, pcie_experts=0.3),
        engine_config=EngineConfig(max_batch_size=2), status=lines.append)
    said = [line for line in lines if line.startswith("GPU-held routed experts")]
    assert said and "5 of 16 experts a layer in page-locked host memory" in said[0]
