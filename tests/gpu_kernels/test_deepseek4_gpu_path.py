"""DeepSeek-V4's GPU layout (the bundled DeepSeek-V4.yaml) on gpu_kernels, its GPU moved to the
CPU where there is none (Triton's interpreter): the grouped output projection's one grouped
product against transformers' DeepseekV4GroupedLinear on the dequantized weight, and the
engine serving the layout with the CPU layout's greedy tokens and log-probabilities.

Both with exact CPU experts: the bundled files' fast experts are another arithmetic (fast
mode's ~1e-2), the same in both layouts but not what the token comparison checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.rules.planner import with_experts_mode

pytestmark = pytest.mark.usefixtures("wide_tiles")  # see conftest.WIDE_TILES

_rng = np.random.default_rng(5)
# past the 16-token window and the 4-token CSA windows
PROMPTS = [[int(t) for t in _rng.integers(3, 1000, size=n)] for n in (9, 40)]
NEW = 6


def _gpu(monkeypatch, device: torch.device) -> dict:
    """LLM/plan keywords that put the rules' `cuda` where the kernels run here."""
    if device.type == "cuda":
        return {}
    monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    return {"device_map": {"cuda": "cpu"}}


@pytest.mark.parametrize("quant", ["f32", "q4_k_m", "mxfp4_moe"])
def test_grouped_output_projection_equals_transformers(models, monkeypatch, device, quant):
    from hybrid.model.loader import load_model
    from hybrid.rules.inject import inject
    from hybrid.rules.planner import plan_model

    path = str(models.path("tiny-v4", quant))
    model = inject(plan_model(path, "DeepSeek-V4", announce=False, **_gpu(monkeypatch, device)))
    ref = load_model(path).model
    for i in range(len(ref.model.layers)):
        name = f"model.layers.{i}.self_attn.o_a_proj"
        ours, theirs = model.get_submodule(name), ref.get_submodule(name)
        assert ours.kernels.name == "gpu_kernels" and ours.groups == theirs.n_groups
        for tokens in (1, 5):
            x = torch.randn(tokens, theirs.n_groups, theirs.in_features,
                            generator=torch.Generator().manual_seed(tokens))  # [N, G, in]
            with torch.inference_mode():
                want = theirs.double()(x.double())  # [N, G, out/G]
                got = ours(x.to(device)).cpu().double()
            assert got.shape == want.shape
            assert float((got - want).norm() / want.norm()) <= 1e-5, (name, tokens)


def _served(llm: LLM) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)]


def test_gpu_layout_serves_the_cpu_layouts_tokens(models, monkeypatch, device, tmp_path):
    path = str(models.path("tiny-v4", "q4_k_m"))
    config = EngineConfig(chunk_size=16, max_batch_size=2)
    cpu_rules = with_experts_mode("DeepSeek-V4-cpu", "exact", tmp_path)
    want = _served(LLM(path, str(cpu_rules), engine_config=config))
    gpu_rules = with_experts_mode("DeepSeek-V4", "exact", tmp_path)
    gpu = LLM(path, str(gpu_rules), engine_config=config, **_gpu(monkeypatch, device))
    assert gpu.engine.runner.device.type == device.type
    for i, (g, w) in enumerate(zip(_served(gpu), want)):
        assert g.token_ids == w.token_ids, i
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) <= 1e-4, i


EXPERTS_RULE = ("{class: experts, kwargs: {generate_device: cpu, backend: cpu, mode: fast}}")


@pytest.mark.parametrize("experts", [
    ("{class: experts, kwargs: {generate_device: cpu, backend: cpu, mode: exact, "
     "gpu_experts: [0, 3, 5], gpu_device: cuda}}"),  # hot experts beside the CPU's
    "{class: experts, kwargs: {generate_device: cuda, backend: torch}}"],  # all on the GPU
    ids=["hot", "all"])
def test_clamped_experts_on_the_gpu_equal_transformers(models, monkeypatch, device, tmp_path,
                                                       experts: str) -> None:
    """V4's routed experts (MXFP4, clamped SwiGLU) on gpu_kernels' grouped launches, some
    (`gpu_experts`, as `hybrid tune` writes them) or all: transformers' logits."""
    from hybrid.model.loader import load_model
    from hybrid.rules.inject import inject
    from hybrid.rules.planner import find_rules, plan_model

    text = find_rules("DeepSeek-V4").read_text()
    assert EXPERTS_RULE in text
    rules = tmp_path / "v4-gpu-experts.yaml"
    rules.write_text(text.replace(EXPERTS_RULE, experts))
    path = str(models.path("tiny-v4", "mxfp4_moe"))
    model = inject(plan_model(path, str(rules), announce=False, **_gpu(monkeypatch, device)))
    op = model.get_submodule("model.layers.1.mlp.experts")
    assert op.swiglu_limit == 10.0 and (op.gpu_experts or op.on_device).kernels
    prompt = PROMPTS[1]
    with torch.inference_mode():  # the ids where the embedding is: its output stays there
        ours = model(input_ids=torch.tensor([prompt], device=device)).logits[0].cpu().double()
        ref = load_model(path).model(input_ids=torch.tensor([prompt])).logits[0].double()
    assert float((ours - ref).norm() / ref.norm()) <= 1e-4
