"""Experts' planes in one host buffer and the used ones copied to the device (expert_gather.py):
the copy against its reference over types, expert counts and used sets, and the grouped
products over the copied planes equal to those over the planes they came from."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from gpu_kernels.expert_gather import gather_used, gather_used_ref, host_layout
from gpu_kernels.moe_grouped import moe_experts
from tests.gpu_kernels.test_moe_grouped import INTER, H, stacked


@pytest.mark.parametrize("types,experts", [((Q.Q4_K, Q.Q4_K, Q.Q8_0), 4),
                                           ((Q.Q6_K, Q.Q5_K, Q.Q4_0), 3),
                                           ((Q.Q3_K, Q.Q2_K, Q.IQ4_XS), 5)])
def test_gather_used_matches_its_reference(device, types, experts) -> None:
    parts = [stacked(t, experts, INTER if i < 2 else H, H if i < 2 else INTER, i, device)
             for i, t in enumerate(types)]
    layout = host_layout(parts, experts, device)
    assert all(p.device.type == "cpu" for q in layout.parts for p in q.planes)
    if device.type == "cuda":
        assert layout.host.is_pinned()
    for q, original in zip(layout.parts, parts):  # the host copy holds the planes' bytes
        assert all(torch.equal(a, b.cpu()) for a, b in zip(q.planes, original.planes))
    g = torch.Generator().manual_seed(experts)
    for _ in range(3):
        used = (torch.rand(experts, generator=g) < 0.5).to(torch.int8).to(device)
        got = torch.full((layout.nbytes + 64,), 7, dtype=torch.uint8, device=device)
        want = got.clone()
        gather_used(layout, got, used)
        gather_used_ref(layout, want, used)
        assert torch.equal(got, want)


def test_products_over_gathered_planes_equal_the_originals(device) -> None:
    experts = 4
    parts = [stacked(Q.Q4_K, experts, INTER, H, 0, device),
             stacked(Q.Q4_K, experts, INTER, H, 1, device),
             stacked(Q.Q8_0, experts, H, INTER, 2, device)]
    layout = host_layout(parts, experts, device)
    ids = torch.tensor([[0, 2], [2, -1], [0, 0]], device=device)  # experts 1 and 3 unused
    used = torch.tensor([1, 0, 1, 0], dtype=torch.int8, device=device)
    buffer = torch.zeros(layout.nbytes, dtype=torch.uint8, device=device)
    gather_used(layout, buffer, used)
    on_device = layout.views(buffer)
    x = torch.randn(3, H, device=device)
    w = torch.rand(3, 2, device=device)
    want = moe_experts(x, ids, w, tuple(parts[:2]), parts[2], experts)
    got = moe_experts(x, ids, w, tuple(on_device[:2]), on_device[2], experts)
    assert torch.equal(got, want)


def test_gather_used_refuses_a_short_buffer(device) -> None:
    parts = [stacked(Q.Q8_0, 2, INTER, H, 0, device)]
    layout = host_layout(parts, 2, device)
    with pytest.raises(ValueError, match="gather_used"):
        gather_used(layout, torch.empty(layout.nbytes - 1, dtype=torch.uint8, device=device),
                    torch.ones(2, dtype=torch.int8, device=device))


def test_engine_tokens_equal_with_held_experts_in_host_memory(models, tmp_path, monkeypatch,
                                                              device, wide_tiles) -> None:
    """The same experts held in device memory and in host memory (copied as used, into the
    staging buffer every layer shares) give the same greedy tokens, the logprobs within
    roundings (steps of few rows leave host-memory experts to the CPU's kernels)."""
    from gpu_kernels import expert_gather
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.ops.experts import ExpertsOp
    from hybrid.rules.planner import with_gpu_experts

    if device.type == "cpu":  # the held experts' kernels in the interpreter; the rest torch
        monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    copies = []
    gather = expert_gather.gather_used
    monkeypatch.setattr(expert_gather, "gather_used",
                        lambda *a: copies.append(1) or gather(*a))
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    got = {}
    for memory in ("device", "host"):
        (tmp_path / memory).mkdir()
        rules = with_gpu_experts("cpu", [1, 5, 9], memory, tmp_path / memory,
                                 device=str(device))
        llm = LLM(path, str(rules), engine_config=EngineConfig(max_batch_size=2))
        ops = [m.gpu_experts for m in llm.engine.runner.model.modules()
               if isinstance(m, ExpertsOp)]
        assert ops and all(op.kernels and (op.layout is not None) == (memory == "host")
                           for op in ops)
        if memory == "host":  # one buffer for all layers
            assert len({id(op.staging) for op in ops}) == 1
        copies.clear()  # start-up's warm-up copied too
        out = llm.generate(prompt_token_ids=[list(range(5, 17)), [9, 10]],
                           sampling_params=params)
        got[memory] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in out]
        assert bool(copies) == (memory == "host")  # the 12-token prompt's step copied
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got["host"], got["device"]):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-4)


def test_a_host_that_will_not_lock_the_memory_leaves_the_experts_to_the_cpu(
        models, tmp_path, monkeypatch, caplog) -> None:
    """Page-locking can fail (the host's memory, its locked-memory limit): the layer warns and
    its CPU experts compute every expert; the start goes on and the tokens are the CPU's."""
    from gpu_kernels import expert_gather
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.ops import device_experts
    from hybrid.ops.experts import ExpertsOp
    from hybrid.rules.planner import with_gpu_experts

    # the held experts take the kernels' path (the rest of cpu.yaml stays in torch)
    monkeypatch.setattr(device_experts, "gpu_kernels_cover", lambda *a: True)

    def refuse(*a, **k):
        raise expert_gather.HostMemoryUnavailable("12 MiB of page-locked host memory: refused")
    monkeypatch.setattr(expert_gather, "host_layout", refuse)
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    rules = with_gpu_experts("cpu", [1, 5, 9], "host", tmp_path, device="cpu")
    llm = LLM(path, str(rules), engine_config=EngineConfig(max_batch_size=2))
    ops = [m for m in llm.engine.runner.model.modules() if isinstance(m, ExpertsOp)]
    assert ops and all(op.gpu_experts is None and not op.gpu_held.any() for op in ops)
    assert "the CPU computes every expert" in caplog.text
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    cpu = LLM(path, "cpu", engine_config=EngineConfig(max_batch_size=2))
    prompt = [list(range(5, 17))]
    assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompt,
                                                        sampling_params=params)] == \
        [o.outputs[0].token_ids for o in cpu.generate(prompt_token_ids=prompt,
                                                     sampling_params=params)]
