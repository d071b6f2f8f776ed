"""What a DeepSeek-V4 GGUF (architecture `deepseek4`) says the model is: `V4Spec`.

V4 is not MLA: one shared key/value head of `head_dim` (K = V) beside `num_heads` query heads
(from a q_lora latent), a sliding window over the raw keys in every layer, and per layer a
compress ratio: 0 (the window alone), 4 (CSA: keys compressed 4 to 1 in overlapping windows, a
lightning indexer picking the top-k of them) or 128 (HCA: 128 to 1, all of them attended).
The residual is `hc_mult` (4) streams mixed by hyper-connections; the output projection is
grouped low-rank (`o_groups` x `o_lora_rank`); routing scores are sqrt(softplus) with top-k
plus a bias, except the first `num_hash_layers` layers, whose experts a frozen token-id table
picks; the experts' SwiGLU clamps gate (above) and up (both sides) at `swiglu_limit`.

Keys as llama.cpp's converter writes them (`conversion/deepseek.py`, `DeepseekV4Model`) and its
loader requires them (`src/models/deepseek4.cpp`); transformers' `DeepseekV4Config` is built
from them with its legacy keywords `compress_ratios` and `num_hash_layers`. Checked here: the
constraints both engines share (one KV head, one shared expert, normalized top-k, hc_mult 4,
ratios in {0, 4, 128}, sqrt-softplus gating), so a file they would read differently fails at
start-up with the key named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybrid.errors import GGUFError

ARCH_V4 = "deepseek4"
COMPRESS_RATIOS = (0, 4, 128)  # the window alone, CSA, HCA (fixed in both engines)
_LAYER_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention",
                128: "heavily_compressed_attention"}
GATING_SQRT_SOFTPLUS = 4  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRTSOFTPLUS


@dataclass(frozen=True)
class V4Spec:
    num_layers: int  # the trunk (an MTP block, when written, is skipped)
    hidden_size: int
    vocab_size: int
    num_heads: int
    head_dim: int  # of q, and of the one shared key/value head
    qk_rope_head_dim: int  # the last this many dims of each head are rotated
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    compress_ratios: tuple[int, ...]  # per layer, one of COMPRESS_RATIOS
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    num_hash_layers: int  # the first layers route by token id (ffn_gate_tid2eid)
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    rope_theta: float  # the window's RoPE
    compress_rope_theta: float  # compressed keys' and the indexer's RoPE
    rope_scaling: dict[str, Any] | None  # YaRN of the compressed branches, or None
    context_length: int
    name: str
    arch: str = ARCH_V4
    tied_embeddings: bool = False
    fused_gate_up_experts: bool = False  # the converter writes ffn_gate_exps and ffn_up_exps

    @property
    def first_k_dense(self) -> int:
        """Layers before the first MoE layer (ModelSpec's field): every V4 layer is MoE."""
        return 0

    @property
    def layer_types(self) -> list[str]:
        return [_LAYER_TYPES[r] for r in self.compress_ratios]

    def is_hash_layer(self, i: int) -> bool:
        return i < self.num_hash_layers

    def to_hf_config(self, bos_token_id: int | None = None, eos_token_id: int | None = None):
        """transformers' DeepseekV4Config of the model the file defines."""
        from transformers import DeepseekV4Config

        # flat yarn keys: the config nests them under "compress" (the window's RoPE is plain)
        extra = {"rope_parameters": dict(self.rope_scaling)} if self.rope_scaling else {}
        return DeepseekV4Config(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=1, head_dim=self.head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim, q_lora_rank=self.q_lora_rank,
            o_groups=self.o_groups, o_lora_rank=self.o_lora_rank,
            sliding_window=self.sliding_window, compress_ratios=list(self.compress_ratios),
            index_n_heads=self.index_n_heads, index_head_dim=self.index_head_dim,
            index_topk=self.index_topk, n_routed_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok, n_shared_experts=1,
            moe_intermediate_size=self.moe_intermediate_size, scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=self.routed_scaling_factor,
            num_hash_layers=self.num_hash_layers, swiglu_limit=self.swiglu_limit,
            hc_mult=self.hc_mult, hc_sinkhorn_iters=self.hc_sinkhorn_iters, hc_eps=self.hc_eps,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
            compress_rope_theta=self.compress_rope_theta,
            max_position_embeddings=self.context_length, tie_word_embeddings=False,
            bos_token_id=bos_token_id, eos_token_id=eos_token_id, **extra)


def read_v4_spec(path: str, key: Callable[..., Any], vocab_size: int, name: str) -> V4Spec:
    """The V4Spec of a deepseek4 file; `key(name[, default])` reads `deepseek4.<name>` (a
    missing required key raises GGUFError naming it)."""
    n = int(key("block_count")) - int(key("nextn_predict_layers", 0))
    ratios = tuple(int(r) for r in list(key("attention.compress_ratios"))[:n])
    clamp = key("swiglu_clamp_exp")
    clamp = float(next(iter(clamp))) if isinstance(clamp, (list, tuple)) else float(clamp)
    rope_scaling = None
    if key("rope.scaling.type", "none") == "yarn":
        # llama.cpp takes beta_fast/slow from its defaults (32, 1), not from the file
        rope_scaling = {"rope_type": "yarn", "factor": float(key("rope.scaling.factor")),
                        "original_max_position_embeddings":
                            int(key("rope.scaling.original_context_length")),
                        "beta_fast": 32.0, "beta_slow": 1.0}
    spec = V4Spec(
        num_layers=n, hidden_size=int(key("embedding_length")), vocab_size=vocab_size,
        num_heads=int(key("attention.head_count")),
        head_dim=int(key("attention.key_length")),
        qk_rope_head_dim=int(key("rope.dimension_count")),
        q_lora_rank=int(key("attention.q_lora_rank")),
        o_groups=int(key("attention.output_group_count")),
        o_lora_rank=int(key("attention.output_lora_rank")),
        sliding_window=int(key("attention.sliding_window")), compress_ratios=ratios,
        index_n_heads=int(key("attention.indexer.head_count")),
        index_head_dim=int(key("attention.indexer.key_length")),
        index_topk=int(key("attention.indexer.top_k")),
        num_experts=int(key("expert_count")), num_experts_per_tok=int(key("expert_used_count")),
        moe_intermediate_size=int(key("expert_feed_forward_length")),
        routed_scaling_factor=float(key("expert_weights_scale")),
        num_hash_layers=int(key("hash_layer_count")), swiglu_limit=clamp,
        hc_mult=int(key("hyper_connection.count")),
        hc_sinkhorn_iters=int(key("hyper_connection.sinkhorn_iterations")),
        hc_eps=float(key("hyper_connection.epsilon")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        compress_rope_theta=float(key("attention.compress_rope_freq_base")),
        rope_scaling=rope_scaling, context_length=int(key("context_length", 4096)), name=name)
    _check(path, spec, key)
    return spec


def _check(path: str, spec: V4Spec, key: Callable[..., Any]) -> None:
    s = spec
    checks = [
        (int(key("expert_gating_func", 0)) == GATING_SQRT_SOFTPLUS,
         "expert_gating_func must be 4 (sqrt-softplus), as llama.cpp requires"),
        (int(key("attention.head_count_kv", 1)) == 1, "attention.head_count_kv must be 1"),
        (int(key("attention.value_length", s.head_dim)) == s.head_dim,
         "attention.value_length must equal key_length (K and V are one head)"),
        (int(key("expert_shared_count", 1)) == 1,
         "expert_shared_count must be 1 (transformers' shared MLP is one expert wide)"),
        (bool(key("expert_weights_norm", True)),
         "expert_weights_norm must be true (transformers always normalizes)"),
        (s.hc_mult == 4, f"hyper_connection.count is {s.hc_mult}; both engines take 4"),
        (len(s.compress_ratios) == s.num_layers,
         (f"attention.compress_ratios has {len(s.compress_ratios)} entries for {s.num_layers} "
         f"layers")),
        (all(r in COMPRESS_RATIOS for r in s.compress_ratios),
         f"attention.compress_ratios {list(s.compress_ratios)}: each must be 0, 4 or 128"),
        (s.num_heads % s.o_groups == 0,
         (f"attention.head_count {s.num_heads} is not a multiple of output_group_count "
         f"{s.o_groups}")),
        (0 < s.qk_rope_head_dim <= min(s.head_dim, s.index_head_dim)
         and s.qk_rope_head_dim % 2 == 0,
         f"rope.dimension_count {s.qk_rope_head_dim} must be even and at most the head dims"),
        (s.num_experts_per_tok <= s.num_experts,
         f"expert_used_count {s.num_experts_per_tok} > expert_count {s.num_experts}"),
        (s.num_hash_layers <= s.num_layers,
         f"hash_layer_count {s.num_hash_layers} > {s.num_layers} layers"),
    ]
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise GGUFError(f"{path}: metadata is inconsistent: {'; '.join(problems)}")
