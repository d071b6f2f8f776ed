"""GPU-held ("hot") experts overlap the CPU experts: the host's hand-over mark (the event its
CPU experts wait for; in a whole-step graph the ready flag) comes before their launches, so
the CPU never waits for them. Checked on an eager step with the GPU mapped onto the CPU."""

from __future__ import annotations

import pytest
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
    greedy tokens and logprobs equal those of the same experts held in device memory (here
    the GPU mapped onto the CPU, where both are host memory; tests/gpu_kernels has the CUDA
    check)."""
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
    assert got["host"] == got["device"]


def test_held_experts_memory_is_device_or_host(models, tmp_path) -> None:
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    rules = with_gpu_experts("cpu", [1], "disk", tmp_path, device="cpu")
    with pytest.raises(Exception, match="gpu_experts_memory"):
        LLM(path, str(rules), engine_config=EngineConfig(max_batch_size=1))

