"""scripts/profile_decode.py's floor: which weights a decode step reads on the GPU where no MoE
layer's CPU experts can run beside them."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from profile_decode import unhidden_bytes


def test_the_floor_counts_the_dense_layers_the_first_attention_and_the_head(models):
    path = models.path("tiny-v3", quant="q4_k_m")  # layer 0 dense, layers 1-3 MoE
    sizes = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    first, head = unhidden_bytes(str(path))
    dense = sum(n for name, n in sizes.items() if name.startswith("blk.0."))
    attention = sum(n for name, n in sizes.items() if name.startswith("blk.1.attn"))
    assert dense and attention
    assert first == dense + attention  # not blk.1's router, shared expert or routed experts
    assert head == sizes["output.weight"] + sizes["output_norm.weight"]
