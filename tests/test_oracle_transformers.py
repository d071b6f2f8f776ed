"""Acceptance: our model equals transformers fed the same dequantized weights, for every preset,
quant mix and tensor layout: last-position logits rel. L2 <= 1e-4, greedy 32 tokens identical,
logprobs within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams

from .oracles import rel_l2, transformers_greedy, transformers_logits, transformers_model

PROMPT = [0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223, 736, 21, 1883, 17]
CASES = [
    (preset, quant, layout)
    for preset in ("tiny-v3", "tiny-v2-lite")
    for quant in ("f32", "f16", "bf16", "q8_0", "q4_k_m")
    for layout in ("legacy", "mla")
] + [
    # the mixes people download: i-quant experts (tiny-v2-lite's 96-wide down rows fall back to
    # IQ4_NL), bartowski-style IQ4_XS everywhere
    ("tiny-v3", quant, "legacy") for quant in ("ud-iq1_s", "ud-iq1_m", "ud-iq2_xxs", "ud-q2_k_xl",
                                               "iq4_xs")
] + [("tiny-v2-lite", "ud-iq1_s", "legacy"), ("tiny-v2-lite", "iq4_xs", "mla"),
      # the other deepseek2-architecture families: Kimi-K2 (384 experts, no groups), Moonlight
      ("tiny-kimi-k2", "q4_k_m", "legacy"), ("tiny-moonlight", "q4_k_m", "mla"),
      # llama.cpp's MXFP4_MOE: MXFP4 routed experts (DeepSeek-V4's FP4), Q8_0 elsewhere
      ("tiny-v3", "mxfp4_moe", "legacy"), ("tiny-v2-lite", "mxfp4_moe", "mla")]


@pytest.mark.parametrize("preset,quant,layout", CASES)
def test_matches_transformers(models, preset: str, quant: str, layout: str) -> None:
    path = str(models.path(preset, quant, layout))
    llm = LLM(path)
    oracle = transformers_model(llm.loaded.spec, path)

    ours_logits = llm.loaded.model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    ref_logits = transformers_logits(oracle, PROMPT)[-1]
    assert rel_l2(ours_logits.detach().numpy(), ref_logits.numpy()) <= 1e-4

    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].outputs[0]
    ref_tokens, ref_logprobs = transformers_greedy(oracle, PROMPT, 32)
    assert out.token_ids == ref_tokens
    np.testing.assert_allclose(out.logprobs, ref_logprobs, atol=1e-4)
    # A model that says one token forever would make this test toothless.
    assert len(set(out.token_ids)) >= 4
