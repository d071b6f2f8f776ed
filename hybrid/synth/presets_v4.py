"""DeepSeek-V4 shapes for synthetic `deepseek4` files (spec_v4.py says what each field means).

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
from dataclasses import dataclass

from hybrid.errors import HybridError
from hybrid.model.spec_v4 import ARCH_V4, COMPRESS_RATIOS, V4Spec


@dataclass(frozen=True)
class V4Preset:
    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int  # used with the small vocabulary; the DeepSeek vocabulary has 129,280
    num_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    num_hash_layers: int
    swiglu_limit: float = 10.0
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    yarn_factor: float = 0.0  # 0: no YaRN on the compressed branches
    yarn_original_context: int = 65536
    context_length: int = 4096
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    arch: str = ARCH_V4

    def spec(self, vocab_size: int) -> V4Spec:
        """The spec a file made from this preset declares (vocab_size: its token count)."""
        yarn = None
        if self.yarn_factor:
            yarn = {"rope_type": "yarn", "factor": self.yarn_factor,
                    "original_max_position_embeddings": self.yarn_original_context,
                    "beta_fast": 32.0, "beta_slow": 1.0}
        return V4Spec(
            num_layers=self.num_layers, hidden_size=self.hidden_size, vocab_size=vocab_size,
            num_heads=self.num_heads, head_dim=self.head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim, q_lora_rank=self.q_lora_rank,
            o_groups=self.o_groups, o_lora_rank=self.o_lora_rank,
            sliding_window=self.sliding_window, compress_ratios=self.compress_ratios,
            index_n_heads=self.index_n_heads, index_head_dim=self.index_head_dim,
            index_topk=self.index_topk, num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.moe_intermediate_size,
            routed_scaling_factor=self.routed_scaling_factor,
            num_hash_layers=self.num_hash_layers, swiglu_limit=self.swiglu_limit,
            hc_mult=self.hc_mult, hc_sinkhorn_iters=self.hc_sinkhorn_iters, hc_eps=self.hc_eps,
            rms_norm_eps=1e-6, rope_theta=self.rope_theta,
            compress_rope_theta=self.compress_rope_theta, rope_scaling=yarn,
            context_length=self.context_length, name=self.name)

    def with_layers(self, num_layers: int) -> V4Preset:
        """This preset with `num_layers` layers: its ratio pattern continued (the first two
        kept), as many hash-routed layers as fit."""
        if num_layers < 1:
            raise HybridError(f"--layers must be at least 1, got {num_layers}")
        head, cycle = self.compress_ratios[:2], self.compress_ratios[2:] or self.compress_ratios
        ratios = (head + tuple(cycle[i % len(cycle)] for i in range(num_layers)))[:num_layers]
        if 4 not in ratios:
            raise HybridError(f"--layers {num_layers} with {self.name} leaves no CSA layer "
                              f"(compress ratio 4), without which llama.cpp cannot run the file")
        return dataclasses.replace(self, num_layers=num_layers, compress_ratios=ratios,
                                   num_hash_layers=min(self.num_hash_layers, num_layers))


_FLASH_RATIOS = (128, 128) + tuple(4 if i % 2 else 128 for i in range(41))
V4 = V4Preset(
    name="v4", num_layers=43, hidden_size=4096, vocab_size=129280, num_heads=64, head_dim=512,
    qk_rope_head_dim=64, q_lora_rank=1024, o_groups=8, o_lora_rank=1024, sliding_window=128,
    compress_ratios=_FLASH_RATIOS, index_n_heads=64, index_head_dim=128, index_topk=512,
    num_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048,
    routed_scaling_factor=1.5, num_hash_layers=3, yarn_factor=16.0,
    context_length=1048576)
TINY_V4 = V4Preset(
    name="tiny-v4", num_layers=3, hidden_size=64, vocab_size=1024, num_heads=4, head_dim=64,
    qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=16,
    compress_ratios=(0, 4, 128), index_n_heads=8, index_head_dim=64, index_topk=4,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, routed_scaling_factor=1.5,
    num_hash_layers=1)
V4_PRESETS = {p.name: p for p in (V4, TINY_V4)}
assert all(r in COMPRESS_RATIOS for p in V4_PRESETS.values() for r in p.compress_ratios)
