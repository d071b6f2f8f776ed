"""DeepSeek-V3.2 served on gpu_kernels (the bundled DeepSeek-V3.2.yaml, its GPU moved to the CPU
and its kernels run in Triton's interpreter): the decode rows' sparse attention in
gpu_kernels/mla_index.py, the prompt chunks' rows too (in blocks of a few rows here) give the
CPU rules' greedy tokens and logprobs, in one batch of decodes beside prompt chunks with prompts
longer than the top-k.

Both with an f32 KV cache and exact CPU experts (the CPU rules'): the GPU rules' bf16 cache and
fast experts move the indexer's scores by ~1e-3, enough to swap two keys tied that closely at the
top-k's edge (a different, equally valid selection), so no token comparison would hold there."""

from __future__ import annotations

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.rules.planner import with_experts_mode, with_kv_cache_dtype

pytestmark = pytest.mark.usefixtures("wide_tiles")  # see conftest.WIDE_TILES

PROMPTS = [[0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223, 736, 21, 1883, 17, 99],
           [5, 9], list(range(100, 121))]
MAX_TOKENS = 12


def _served(llm: LLM):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)]


def test_gpu_rules_serve_the_cpu_rules_tokens(models, monkeypatch, tmp_path) -> None:
    path = str(models.path("tiny-v32", "f32", "mla"))
    config = EngineConfig(max_batch_size=3, cache_lens=512, page_size=16, chunk_size=8)
    want = _served(LLM(path, "cpu", engine_config=config))
    monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    from hybrid.ops.kernel_sets import gpu_set

    monkeypatch.setattr(gpu_set, "SPARSE_SCORE_BYTES", 4 * 3 * 24)  # 3 rows a block at 24 keys
    rules = with_kv_cache_dtype(str(with_experts_mode("DeepSeek-V3.2", "exact", tmp_path)),
                                "f32", tmp_path)
    gpu = LLM(path, str(rules), device_map={"cuda": "cpu"}, engine_config=config)
    attention = gpu.engine.runner.program.model.model.layers[0].self_attn
    assert attention.kernels.name == "gpu_kernels" and attention.index_head_dim
    got = _served(gpu)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.token_ids == w.token_ids, i
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) <= 1e-4, i
