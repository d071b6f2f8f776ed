"""A share of each step's routed experts read by the GPU from host memory
(hybrid/engine/prefill/fetched_experts.py): the gather kernel against its reference, which
experts a step fetches, their products against the grouped experts on every expert's planes,
and whole steps (Triton's interpreter, the GPU mapped onto the CPU) keeping the tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cpu_kernels.fast.packed import PackedMatrix
from cpu_kernels.formats.weights import QuantMatrix
from gpu_kernels import moe_grouped
from gpu_kernels import qtypes as qt
from gpu_kernels.host_gather import gather_rows, gather_rows_ref
from hybrid.engine.prefill.expert_stream import StreamTensor
from hybrid.engine.prefill.fetched_experts import FetchedExperts, slots_for
from hybrid.synth.random_blocks import random_rows


@pytest.mark.parametrize("rows,nbytes,slots", [(5, 64, 3), (9, 4100, 4), (4, 37, 2),
                                               (3, 70000, 2)])
def test_gather_rows_equals_reference(rows, nbytes, slots) -> None:
    g = torch.Generator().manual_seed(rows)
    src = torch.randint(0, 256, (rows, nbytes), dtype=torch.uint8, generator=g)
    which = torch.tensor([rows - 1, -1, 0, 1][:slots])
    got = torch.full((slots, nbytes), 7, dtype=torch.uint8)
    want = got.clone()
    gather_rows(src, which, got)
    gather_rows_ref(src, which, want)
    assert torch.equal(got, want)  # slots of -1 keep their bytes


def _fetcher(share: float, slots: int, experts: int = 8, hidden: int = 256, inter: int = 256,
             packed: bool = False, down: int = qt.Q4_K):
    """Q4_K gate and up, `down` down; the GGUF's blocks, or fast mode's packed copy."""
    rng = np.random.default_rng(0)
    parts = []
    for rows, cols, qtype in ((inter, hidden, qt.Q4_K), (inter, hidden, qt.Q4_K),
                              (hidden, inter, down)):
        host = np.stack([random_rows(rng, qtype, rows, cols, 0.05).reshape(-1)
                         for _ in range(experts)])  # [E, bytes] the GGUF's blocks
        m = QuantMatrix.from_raw(qtype, (experts, rows, cols), host.reshape(-1))
        parts.append(StreamTensor.of(PackedMatrix.of(m) if packed else m))
    raw = [torch.empty(slots, m.expert_nbytes, dtype=torch.uint8) for m in parts]
    return FetchedExperts(tuple(parts), raw, share), parts


def test_a_step_fetches_its_share_of_the_used_experts_lowest_first() -> None:
    f, _ = _fetcher(0.9, slots=3)
    f.set_share(0.4)
    ids = torch.tensor([[5, 1, 7], [1, 6, -1], [3, 5, 1]])  # used: 1 3 5 6 7 (5 experts)
    held = torch.zeros(8, dtype=torch.bool)
    held[3] = True  # held on the GPU already: never fetched; used then 1 5 6 7
    local = f.choose(ids, held)
    # round(0.4 * 4) = 2 experts fetched: 1 and 5, in slots 0 and 1
    assert f.which.tolist() == [1, 5, -1]
    assert local.tolist() == [[1, 0, -1], [0, -1, -1], [-1, 1, 0]]
    f.set_share(0.9)  # capped by the slots
    f.choose(ids, held)
    assert f.which.tolist() == [1, 5, 6]
    with pytest.raises(ValueError, match="built for 0 to 0.9"):
        f.set_share(0.95)


def test_a_step_uses_the_slots_its_rows_can_fill() -> None:
    """Each batch size multiplies only its own slots: the share built with of the most
    experts its rows pick, at most the slots there are."""
    f, _ = _fetcher(0.5, slots=4)  # 8 experts, 3 a row
    assert [f.step_slots(rows, 3) for rows in (1, 2, 3, 16)] == [2, 3, 4, 4]
    ids = torch.tensor([[0, 1, 2]])
    local = f.choose(ids)  # round(0.5 * 3) = 2 of the one row's experts
    assert local.tolist() == [[0, 1, -1]]
    x = torch.randn(1, 256)
    assert f(x, local, torch.ones(1, 3)).shape == (1, 256)


@pytest.mark.parametrize("packed,down", [(False, qt.Q4_K), (True, qt.Q4_K), (True, qt.Q8_0)])
def test_fetched_experts_equal_the_grouped_experts_on_their_pairs(packed, down) -> None:
    """From the GGUF's blocks, or from fast mode's packed copy (unpacked on the device by
    gpu_kernels/packed_unpack.py): the same products as every expert's planes give."""
    f, parts = _fetcher(0.5, slots=4, packed=packed, down=down)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 256, generator=g)
    ids = torch.randint(0, 8, (5, 3), generator=g)
    w = torch.rand(5, 3, generator=g)
    local = f.choose(ids)
    got = f(x, local, w.masked_fill(local < 0, 0.0))
    planes = [m.planes(torch.from_numpy(m.host.reshape(-1).copy()), 8) for m in parts]
    want = moe_grouped.moe_experts(x, ids.masked_fill(local < 0, -1), w, tuple(planes[:2]),
                                   planes[2], 8)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (local >= 0).any() and (local < 0).any()


def test_slots_follow_the_share_and_the_memory() -> None:
    assert slots_for(0.35, 64, 1, 6, 6 << 20, 512 << 20) == 2
    assert slots_for(0.35, 64, 8192, 6, 6 << 20, 512 << 20) == 22
    assert slots_for(0.35, 256, 8192, 8, 28 << 20, 512 << 20) == 9  # the memory's bound


@pytest.mark.skipif(torch.cuda.is_available(), reason="scripts/device_rules_check.py on GPUs")
def test_steps_with_fetched_experts_keep_the_tokens(models, tmp_path, monkeypatch, wide_tiles):
    """tiny-v3 on the GPU path in the interpreter (the prompt steps stream, the decode steps
    fetch): half of each step's experts fetched give the tokens and log-probabilities of the
    same rules with the CPU computing them all (exact mode: the GPU's products equal the
    CPU's to float32 rounding)."""
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.rules.planner import with_experts_mode, with_fetched_experts

    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    exact = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    fetch = str(with_fetched_experts(str(exact), 0.5, tmp_path))
    prompts = [[0, 42, 574, 81, 2058, 3, 223, 804, 853, 13], [5, 6]]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    config = EngineConfig(max_batch_size=4, chunk_size=8, cache_lens=256, page_size=16,
                          prefill_experts="stream")
    monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    llm = LLM(path, fetch, device_map={"cuda": "cpu"}, engine_config=config)
    ops = llm.engine.runner.program.moe_layers
    assert all(op.fetcher is not None for op in ops)
    calls = []
    original = type(ops[0].fetcher).__call__
    monkeypatch.setattr(type(ops[0].fetcher), "__call__",
                        lambda self, *a: calls.append(1) or original(self, *a))
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert len(calls) >= 3 * len(ops)  # every decode step fetched in every layer
    want = LLM(path, str(exact), device_map={"cuda": "cpu"}, engine_config=config).generate(
        prompt_token_ids=prompts, sampling_params=params)
    for a, b in zip(got, want):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs)) \
            <= 1e-4
