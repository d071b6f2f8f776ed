"""DeepSeek-V4 shapes for synthetic `deepseek4` files: V4Specs (spec_v4.py says what each field
means; `vocab_size` is the small vocabulary's, a file's spec takes its tokenizer's).

`v4` is DeepSeek-V4-Flash as transformers' DeepseekV4Config defaults it (43 layers, 256
experts of width 2048, hidden 4096, one 512-wide KV head, HCA in the first two layers then CSA
and HCA in turn, 3 hash-routed layers, YaRN x16 on the compressed branches), for planning.
`tiny-v4` is the smallest file llama.cpp's deepseek4 loader and transformers agree on: a
window-only, a CSA and an HCA layer (llama.cpp needs a CSA layer, and with head_dim equal to
the indexer's also an HCA one), one hash-routed layer, 8 indexer heads (fewer tie at exactly
zero score and the engines break such ties differently), the indexer dims a multiple of 64
(llama.cpp's Hadamard rotation of its keys). Prompts past 128 tokens make the HCA layer emit
a compressed key, past 4 x index_topk the CSA top-k prune.
"""

from __future__ import annotations

import dataclasses

from hybrid.errors import HybridError
from hybrid.model.spec_v4 import COMPRESS_RATIOS, V4Spec


def with_layers(preset: V4Spec, num_layers: int) -> V4Spec:
    """`preset` with `num_layers` layers: its ratio pattern continued (the first two kept), as
    many hash-routed layers as fit."""
    if num_layers < 1:
        raise HybridError(f"--layers must be at least 1, got {num_layers}")
    head, cycle = preset.compress_ratios[:2], preset.compress_ratios[2:] or preset.compress_ratios
    ratios = (head + tuple(cycle[i % len(cycle)] for i in range(num_layers)))[:num_layers]
    if 4 not in ratios:
        raise HybridError(f"--layers {num_layers} with {preset.name} leaves no CSA layer "
                          f"(compress ratio 4), without which llama.cpp cannot run the file")
    return dataclasses.replace(preset, num_layers=num_layers, compress_ratios=ratios,
                               num_hash_layers=min(preset.num_hash_layers, num_layers))


_FLASH_RATIOS = (128, 128) + tuple(4 if i % 2 else 128 for i in range(41))
_COMMON = {"swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0}
V4 = V4Spec(
    name="v4", num_layers=43, hidden_size=4096, vocab_size=129280, num_heads=64, head_dim=512,
    qk_rope_head_dim=64, q_lora_rank=1024, o_groups=8, o_lora_rank=1024, sliding_window=128,
    compress_ratios=_FLASH_RATIOS, index_n_heads=64, index_head_dim=128, index_topk=512,
    num_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048,
    routed_scaling_factor=1.5, num_hash_layers=3, context_length=1048576,
    rope_scaling={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                  "beta_fast": 32.0, "beta_slow": 1.0}, **_COMMON)
TINY_V4 = V4Spec(
    name="tiny-v4", num_layers=3, hidden_size=64, vocab_size=1024, num_heads=4, head_dim=64,
    qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=16,
    compress_ratios=(0, 4, 128), index_n_heads=8, index_head_dim=64, index_topk=4,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, routed_scaling_factor=1.5,
    num_hash_layers=1, context_length=4096, rope_scaling=None, **_COMMON)
V4_PRESETS = {p.name: p for p in (V4, TINY_V4)}
assert all(r in COMPRESS_RATIOS for p in V4_PRESETS.values() for r in p.compress_ratios)
