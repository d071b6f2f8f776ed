"""On a machine with two GPUs: tiny-v3's one-GPU rules against the same rules split over cuda:0
and cuda:1 at layer 2 (hybrid/rules/layer_split.py) give the same greedy tokens and
log-probabilities, with decode graphs (one per stretch, each on its GPU) and eagerly. Skipped
with fewer GPUs; scripts/bench_two_gpus.py runs the same check and the timings."""

from __future__ import annotations

import pytest
import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.rules.layer_split import write_split
from hybrid.rules.planner import with_experts_mode

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")

PROMPTS = [[0, 42, 574, 81, 2058, 3, 223, 804, 853, 13], [0, 9, 99, 999], [0, 5, 6, 7]]


def _greedy(path: str, rules: str, graphs: bool):
    config = EngineConfig(max_batch_size=4, cuda_graphs=graphs, decode_graph="layers",
                          prefix_cache=False, cache_lens=1024)
    llm = LLM(path, rules, engine_config=config)
    assert (llm.engine.runner.graphs is not None) == graphs
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=0, ignore_eos=True)
    out = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    if llm.engine.cpu_pool is not None:
        llm.engine.cpu_pool.close()
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in out]


@pytest.mark.parametrize("graphs", [True, False])
def test_two_gpus_give_one_gpus_tokens(models, tmp_path, graphs) -> None:
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    base = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    split = write_split(str(base), [2], ["cuda:0", "cuda:1"], 4, tmp_path)
    assert _greedy(path, str(split), graphs) == _greedy(path, str(base), graphs)
