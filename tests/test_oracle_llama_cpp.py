"""Acceptance: the same files through llama.cpp (llama-cpp-python) give the same logits.

Relative L2 over all positions' logits: <= 1e-3 for f32, <= 5e-2 for bf16, q8_0, q4_k_m and the
i-quant mixes
(llama.cpp rounds activations to 8 or 16 bits for those, and a routing near-tie can flip; on
failure the message lists each position's error beside its routing margin).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid.model.loader import load_model

from .oracles import llama_cpp_logits, rel_l2, routing_margins

pytest.importorskip("llama_cpp")

_rng = np.random.default_rng(0)
PROMPTS = [[0, *map(int, _rng.integers(3, 4000, size=30))] for _ in range(2)]
MIXES = ("ud-iq1_s", "ud-iq1_m", "ud-iq2_xxs", "ud-q2_k_xl", "iq4_xs")
TOLERANCE = {"f32": 1e-3, "bf16": 5e-2, "q8_0": 5e-2, "q4_k_m": 5e-2, "mxfp4_moe": 5e-2,
             **dict.fromkeys(MIXES, 5e-2)}
CASES = [
    (preset, quant, layout)
    for preset in ("tiny-v3", "tiny-v2-lite")
    for quant in ("f32", "bf16", "q8_0", "q4_k_m")
    for layout in ("legacy", "mla")
] + [("tiny-v3", quant, "legacy") for quant in MIXES] + [
    ("tiny-v2-lite", "ud-iq1_m", "legacy"), ("tiny-v2-lite", "iq4_xs", "mla"),
    ("tiny-kimi-k2", "f32", "legacy"), ("tiny-kimi-k2", "q4_k_m", "mla"),
    ("tiny-moonlight", "f32", "mla"), ("tiny-moonlight", "ud-iq1_s", "legacy"),
    # llama.cpp's MXFP4_MOE (DeepSeek-V4's FP4 experts): MXFP4 experts, Q8_0 elsewhere
    ("tiny-v3", "mxfp4_moe", "legacy"), ("tiny-v2-lite", "mxfp4_moe", "mla")]


@pytest.mark.parametrize("preset,quant,layout", CASES)
def test_matches_llama_cpp(models, preset: str, quant: str, layout: str) -> None:
    path = str(models.path(preset, quant, layout))
    loaded = load_model(path)
    for prompt in PROMPTS:
        with torch.inference_mode():
            ours = loaded.model(input_ids=torch.tensor([prompt])).logits[0].numpy()  # [T, V]
        ref = llama_cpp_logits(path, prompt)
        error = rel_l2(ours, ref)
        if error > TOLERANCE[quant]:
            margins = routing_margins(loaded.model, prompt)
            detail = [(round(rel_l2(ours[t], ref[t]), 4), round(float(margins[t]), 4))
                      for t in range(len(prompt))]
            pytest.fail(f"rel. L2 {error:.4f} > {TOLERANCE[quant]}; (error, routing margin) "
                        f"per position: {detail}")
