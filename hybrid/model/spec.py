"""What a DeepSeek GGUF says the model is: `ModelSpec`, read from metadata, checked, frozen.

It maps onto transformers' `DeepseekV3Config` (sigmoid routing: V3/R1), `DeepseekV2Config`
(softmax routing: V2, V2-Lite, V2.5) or, for architecture `deepseek32`, `DeepseekV32Config`
(V3 plus a lightning indexer per attention layer that picks the top-k cached tokens each query
attends to). Notes on the less obvious keys (see ../shared/FACTS.md):
- `key_length`/`value_length` are per-head q/k and v widths in the legacy layout; the MLA layout
  stores 576/512 there and the real widths in `key_length_mla`/`value_length_mla`.
- `rope.scaling.yarn_log_multiplier` is 0.1 x mscale_all_dim (the converter's convention).
- deepseek32: `attention.indexer.{head_count,key_length,top_k}` are transformers'
  `index_n_heads`, `index_head_dim`, `index_topk`; `block_count` counts the appended NextN/MTP
  block(s) too (`nextn_predict_layers` of them, llama.cpp's `n_layer_all`), which we skip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybrid.errors import GGUFError, shown
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec_v4 import ARCH_V4, V4Spec, read_v4_spec

ARCH = "deepseek2"
ARCH_V32 = "deepseek32"  # DeepSeek-V3.2: MLA + the DSA lightning indexer
ARCHS = (ARCH, ARCH_V32, ARCH_V4)  # deepseek4: DeepSeek-V4 (spec_v4.py)


@dataclass(frozen=True)
class ModelSpec:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    first_k_dense: int
    num_experts: int
    num_experts_per_tok: int
    num_shared_experts: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    scoring_func: str  # "sigmoid" (V3) or "softmax" (V2)
    n_group: int
    topk_group: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # yarn parameters, or None for plain RoPE
    context_length: int
    layout: str  # "legacy" (attn_kv_b) or "mla" (attn_k_b + attn_v_b)
    tied_embeddings: bool
    fused_gate_up_experts: bool
    name: str
    arch: str = ARCH
    # deepseek32's lightning indexer (0 for deepseek2, which has none)
    index_n_heads: int = 0
    index_head_dim: int = 0  # its head layout is [rope | nope], rope the first qk_rope_head_dim
    index_topk: int = 0

    @property
    def has_indexer(self) -> bool:
        return self.arch == ARCH_V32

    @property
    def is_v3(self) -> bool:
        return self.scoring_func == "sigmoid"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def moe_layers(self) -> range:
        return range(self.first_k_dense, self.num_layers)

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_k_dense

    def to_hf_config(self, bos_token_id: int | None = None, eos_token_id: int | None = None):
        """The transformers config of the model the file defines."""
        from transformers import DeepseekV2Config, DeepseekV3Config

        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope = {"rope_theta": self.rope_theta, **self.rope_scaling}
        common = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_heads,
            "n_shared_experts": self.num_shared_experts,
            "n_routed_experts": self.num_experts,
            "routed_scaling_factor": self.routed_scaling_factor,
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": self.q_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "num_experts_per_tok": self.num_experts_per_tok,
            "first_k_dense_replace": self.first_k_dense,
            "norm_topk_prob": self.norm_topk_prob,
            "max_position_embeddings": self.context_length,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tied_embeddings,
            "rope_parameters": rope,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
        }
        if self.has_indexer:
            from transformers import DeepseekV32Config

            # V3.2's config has no rope_interleave: its MLA always rotates adjacent pairs
            # (as GGUF does) and its indexer always rotates halves (as llama.cpp's NEOX rope).
            return DeepseekV32Config(**common, index_n_heads=self.index_n_heads,
                                     index_head_dim=self.index_head_dim,
                                     index_topk=self.index_topk)
        if self.is_v3:
            # GGUF rotates q/k rope dims in adjacent pairs: transformers' "interleave" form.
            return DeepseekV3Config(**common, rope_interleave=True)
        topk_method = "group_limited_greedy" if self.n_group > 1 else "greedy"
        return DeepseekV2Config(**common, topk_method=topk_method)


def read_spec(gguf: GGUFModelFile) -> ModelSpec | V4Spec:
    """Build and check the spec of an opened GGUF model (V4Spec for a deepseek4 file)."""
    md = gguf.metadata
    arch = md.get("general.architecture")
    if arch not in ARCHS:
        raise GGUFError(
            f"{gguf.path}: architecture '{shown(arch)}' is not a DeepSeek model; hybrid runs "
            f"'{ARCH}' GGUFs (DeepSeek-V2, V2-Lite, V2.5, V3, R1), '{ARCH_V32}' (V3.2) and "
            f"'{ARCH_V4}' (V4)"
        )

    def key(name: str, default: Any = ...) -> Any:
        full = f"{arch}.{name}"
        if full in md:
            return md[full]
        if default is ...:
            raise GGUFError(f"{gguf.path}: metadata key {full} is missing; the file is incomplete")
        return default

    if arch == ARCH_V4:
        return read_v4_spec(str(gguf.path), key, _vocab_size(gguf, key),
                            str(md.get("general.name", gguf.path.stem)))
    num_layers = int(key("block_count"))
    if arch == ARCH_V32:
        # the converter appends the MTP block(s) past the trunk: blk.61 of a 62-block V3.2 file
        num_layers -= int(key("nextn_predict_layers", 0))
    layout = "mla" if gguf.has_tensor("blk.0.attn_k_b.weight") else "legacy"
    rope_dim = int(key("rope.dimension_count"))
    if layout == "mla":
        qk_head = int(key("attention.key_length_mla"))
        v_head = int(key("attention.value_length_mla"))
    else:
        qk_head = int(key("attention.key_length"))
        v_head = int(key("attention.value_length"))
    has_q_lora = gguf.has_tensor("blk.0.attn_q_a.weight")
    gating = int(key("expert_gating_func", 1))
    if gating not in (1, 2):
        raise GGUFError(f"{gguf.path}: expert_gating_func {gating} is unknown (1=softmax, 2=sigmoid)")
    vocab = _vocab_size(gguf, key)
    n_group = int(key("expert_group_count", 1))
    rope_scaling = None
    if key("rope.scaling.type", "none") == "yarn":
        mscale_all_dim = float(key("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        rope_scaling = {
            "rope_type": "yarn",
            "factor": float(key("rope.scaling.factor")),
            "original_max_position_embeddings": int(key("rope.scaling.original_context_length")),
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            # mscale == mscale_all_dim makes the cos/sin factor 1, as llama.cpp computes it.
            "mscale": mscale_all_dim,
            "mscale_all_dim": mscale_all_dim,
        }
    first_dense = int(key("leading_dense_block_count", 0))
    spec = ModelSpec(
        num_layers=num_layers,
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")),
        moe_intermediate_size=int(key("expert_feed_forward_length")),
        num_heads=int(key("attention.head_count")),
        q_lora_rank=int(key("attention.q_lora_rank")) if has_q_lora else None,
        kv_lora_rank=int(key("attention.kv_lora_rank")),
        qk_nope_head_dim=qk_head - rope_dim,
        qk_rope_head_dim=rope_dim,
        v_head_dim=v_head,
        vocab_size=vocab,
        first_k_dense=first_dense,
        num_experts=int(key("expert_count")),
        num_experts_per_tok=int(key("expert_used_count")),
        num_shared_experts=int(key("expert_shared_count", 0)),
        routed_scaling_factor=float(key("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(key("expert_weights_norm", False)),
        scoring_func="sigmoid" if gating == 2 else "softmax",
        n_group=n_group,
        topk_group=int(key("expert_group_used_count", n_group)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        context_length=int(key("context_length", 4096)),
        layout=layout,
        tied_embeddings=not gguf.has_tensor("output.weight"),
        fused_gate_up_experts=gguf.has_tensor(f"blk.{first_dense}.ffn_gate_up_exps.weight"),
        name=str(md.get("general.name", gguf.path.stem)),
        **(_indexer_fields(key) if arch == ARCH_V32 else {}),
    )
    _check_spec(gguf, spec)
    return spec


def _vocab_size(gguf: GGUFModelFile, key: Callable[..., Any]) -> int:
    vocab = key("vocab_size", None)
    if vocab is None:
        tokens = gguf.metadata.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens else gguf.tensor_infos["token_embd.weight"][0].shape[0]
    return int(vocab)


def _indexer_fields(key: Callable[..., Any]) -> dict[str, Any]:
    return {
        "arch": ARCH_V32,
        "index_n_heads": int(key("attention.indexer.head_count")),
        "index_head_dim": int(key("attention.indexer.key_length")),
        "index_topk": int(key("attention.indexer.top_k")),
    }


def _check_spec(gguf: GGUFModelFile, spec: ModelSpec) -> None:
    problems = []
    if spec.has_indexer:
        # what llama.cpp's deepseek32 loader and transformers' DeepseekV32Attention require
        if spec.layout != "mla":
            problems.append("deepseek32 requires the MLA layout (attn_k_b/attn_v_b)")
        if spec.q_lora_rank is None:
            problems.append("deepseek32 requires q_lora (its indexer reads the q_a latent)")
        if not spec.is_v3:
            problems.append("deepseek32 routes with sigmoid (expert_gating_func 2)")
        if spec.index_head_dim < spec.qk_rope_head_dim:
            problems.append(f"indexer key_length {spec.index_head_dim} is smaller than the "
                            f"rope dimension {spec.qk_rope_head_dim}")
        if spec.index_n_heads < 1 or spec.index_topk < 1:
            problems.append("indexer head_count and top_k must be at least 1")
    if spec.qk_nope_head_dim < 1:
        problems.append("key length is not larger than the rope dimension")
    if spec.num_experts_per_tok > spec.num_experts:
        problems.append(f"expert_used_count {spec.num_experts_per_tok} > expert_count {spec.num_experts}")
    if spec.n_group > 1 and spec.num_experts % spec.n_group:
        problems.append(f"expert_count {spec.num_experts} is not divisible by {spec.n_group} groups")
    if spec.scoring_func == "softmax" and spec.norm_topk_prob:
        problems.append("softmax routing with expert_weights_norm is not supported (no DeepSeek uses it)")
    if problems:
        raise GGUFError(f"{gguf.path}: metadata is inconsistent: {'; '.join(problems)}")
