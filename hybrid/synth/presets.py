"""Shapes and routing semantics of the synthetic models `hybrid make-model` writes.

`tiny-*` are CI-sized but keep every feature of the real model they stand for; `v2-lite`, `v3`,
`kimi-k2` and `moonlight` have the real widths of DeepSeek-V2-Lite, DeepSeek-V3/R1, Kimi-K2
(Moonshot's 1T deepseek2-architecture MoE: 384 routed experts, 64 heads, no expert groups) and
Moonlight-16B-A3B (V2-Lite's attention with V3's sigmoid routing, plain RoPE), from their
config.json files. NOTE: llama.cpp decides "V2-Lite-like" (no q_lora) by the
layer count (26 or 27), so `tiny-v2-lite` keeps 27 layers and `tiny-v3` must not have 26/27.
`tiny-v32` and `v32` are DeepSeek-V3.2 (architecture deepseek32): V3 plus the lightning indexer;
tiny-v32's top-k (8) is below a short prompt's length, so its sparse attention is not dense.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hybrid.errors import HybridError


@dataclass(frozen=True)
class Preset:
    name: str
    num_layers: int
    first_k_dense: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_experts: int
    num_experts_per_tok: int
    num_shared_experts: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    sigmoid_gating: bool
    n_group: int  # 1 = flat top-k (the metadata keys are then omitted)
    topk_group: int
    vocab_size: int  # used with the small vocabulary; the DeepSeek vocabulary has 129,280
    rope_factor: float
    yarn_log_multiplier: float  # 0.1 x mscale_all_dim, as llama.cpp's converter writes it
    context_length: int
    rope_theta: float = 10000.0
    yarn: bool = True  # False: plain RoPE, no rope.scaling keys (Moonlight)
    arch: str = "deepseek2"  # or "deepseek32" (V3.2: the indexer below)
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense


_TINY_V3 = Preset(
    name="tiny-v3", num_layers=4, first_k_dense=1, hidden_size=256, intermediate_size=512,
    moe_intermediate_size=256, num_heads=4, q_lora_rank=128, kv_lora_rank=128,
    qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, num_experts=16,
    num_experts_per_tok=4, num_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    sigmoid_gating=True, n_group=4, topk_group=2, vocab_size=4096, rope_factor=40.0,
    yarn_log_multiplier=0.1, context_length=163840,
)
_TINY_V2_LITE = Preset(
    name="tiny-v2-lite", num_layers=27, first_k_dense=1, hidden_size=256, intermediate_size=512,
    moe_intermediate_size=96, num_heads=2, q_lora_rank=None, kv_lora_rank=64,
    qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, num_experts=6,
    num_experts_per_tok=2, num_shared_experts=2, routed_scaling_factor=1.0, norm_topk_prob=False,
    sigmoid_gating=False, n_group=1, topk_group=1, vocab_size=4096, rope_factor=40.0,
    yarn_log_multiplier=0.0707, context_length=163840,
)
_V2_LITE = Preset(
    name="v2-lite", num_layers=27, first_k_dense=1, hidden_size=2048, intermediate_size=10944,
    moe_intermediate_size=1408, num_heads=16, q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=64,
    num_experts_per_tok=6, num_shared_experts=2, routed_scaling_factor=1.0, norm_topk_prob=False,
    sigmoid_gating=False, n_group=1, topk_group=1, vocab_size=102400, rope_factor=40.0,
    yarn_log_multiplier=0.0707, context_length=163840,
)
_V3 = Preset(
    name="v3", num_layers=61, first_k_dense=3, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=256,
    num_experts_per_tok=8, num_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    sigmoid_gating=True, n_group=8, topk_group=4, vocab_size=129280, rope_factor=40.0,
    yarn_log_multiplier=0.1, context_length=163840,
)
_KIMI_K2 = Preset(
    name="kimi-k2", num_layers=61, first_k_dense=1, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_heads=64, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=384,
    num_experts_per_tok=8, num_shared_experts=1, routed_scaling_factor=2.827, norm_topk_prob=True,
    sigmoid_gating=True, n_group=1, topk_group=1, vocab_size=163840, rope_factor=32.0,
    yarn_log_multiplier=0.1, context_length=131072, rope_theta=50000.0,
)
_MOONLIGHT = Preset(
    name="moonlight", num_layers=27, first_k_dense=1, hidden_size=2048, intermediate_size=11264,
    moe_intermediate_size=1408, num_heads=16, q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_experts=64,
    num_experts_per_tok=6, num_shared_experts=2, routed_scaling_factor=2.446, norm_topk_prob=True,
    sigmoid_gating=True, n_group=1, topk_group=1, vocab_size=163840, rope_factor=1.0,
    yarn_log_multiplier=0.0, context_length=8192, rope_theta=50000.0, yarn=False,
)
# CI-sized stand-ins: Kimi-K2's 384 experts with ungrouped sigmoid routing; Moonlight's
# no-q_lora attention (27 layers, see above) with sigmoid routing and plain RoPE
_TINY_KIMI_K2 = dataclasses.replace(
    _TINY_V3, name="tiny-kimi-k2", num_heads=8, num_experts=384, num_experts_per_tok=8,
    moe_intermediate_size=32 * 8, n_group=1, topk_group=1, routed_scaling_factor=2.827,
    rope_factor=32.0, rope_theta=50000.0, context_length=131072,
)
_TINY_MOONLIGHT = dataclasses.replace(
    _TINY_V2_LITE, name="tiny-moonlight", sigmoid_gating=True, norm_topk_prob=True,
    routed_scaling_factor=2.446, rope_theta=50000.0, yarn=False, context_length=8192,
)
# DeepSeek-V3.2-Exp's config.json: V3's widths, index_n_heads 64, index_head_dim 128, top-k 2048
_V32 = dataclasses.replace(_V3, name="v32", arch="deepseek32", index_n_heads=64,
                           index_head_dim=128, index_topk=2048)
# 16 indexer heads, not fewer: a key scores exactly 0 when every head's relu is 0 (1 in 2^Hi),
# and exact ties at the top-k boundary would make the chosen keys up to each top-k's tie order
_TINY_V32 = dataclasses.replace(_TINY_V3, name="tiny-v32", arch="deepseek32", index_n_heads=16,
                                index_head_dim=64, index_topk=8)
PRESETS = {p.name: p for p in (_TINY_V3, _TINY_V2_LITE, _V2_LITE, _V3, _KIMI_K2, _MOONLIGHT,
                               _TINY_KIMI_K2, _TINY_MOONLIGHT, _V32, _TINY_V32)}


def get_preset(name: str, num_layers: int | None = None) -> Preset:
    """The preset `name`, optionally with `num_layers` layers (dense ones kept first)."""
    if name not in PRESETS:
        raise HybridError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    preset = PRESETS[name]
    if num_layers is None:
        return preset
    if num_layers < 1:
        raise HybridError(f"--layers must be at least 1, got {num_layers}")
    lite = preset.q_lora_rank is None
    if lite != (num_layers in (26, 27)):
        raise HybridError(
            f"--layers {num_layers} with {name}: llama.cpp recognizes a model without q_lora "
            "(V2-Lite-like) only at 26 or 27 layers; pick a layer count that keeps that true"
        )
    return dataclasses.replace(
        preset, num_layers=num_layers, first_k_dense=min(preset.first_k_dense, num_layers - 1)
    )
