"""GGUF tensor names and shapes <-> transformers' DeepSeek parameter names.

`expected_gguf_shapes(spec)` lists every tensor the metadata implies, with its shape (numpy
order: `[out, in]`, stacked experts `[E, out, in]`), so a file that contradicts its metadata
fails with a message naming the tensor before anything is loaded. `load_hf_weight` builds one
parameter of transformers' module tree as fp32, rebuilding the two places where the layouts
differ: the MLA layout's `attn_k_b`/`attn_v_b` (-> `kv_b_proj`) and split gate/up experts
(-> `gate_up_proj`). deepseek32's indexer tensors (`blk.N.indexer.*`, llama.cpp's names) map
one to one, unchanged: llama.cpp applies its indexer RoPE in transformers' half-split form.
"""

from __future__ import annotations

import torch

from hybrid.errors import GGUFError
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.model.spec_v4 import V4Spec
from hybrid.model.tensor_map_v4 import combine_v4_sources, expected_v4_shapes, v4_gguf_sources

Shape = tuple[int, ...]


def expected_gguf_shapes(spec: ModelSpec | V4Spec) -> dict[str, Shape]:
    if isinstance(spec, V4Spec):
        return expected_v4_shapes(spec)
    s = spec
    H, V = s.hidden_size, s.vocab_size
    shapes: dict[str, Shape] = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if not s.tied_embeddings:
        shapes["output.weight"] = (V, H)
    for i in range(s.num_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (H,)
        if s.q_lora_rank is not None:
            shapes[p + "attn_q_a.weight"] = (s.q_lora_rank, H)
            shapes[p + "attn_q_a_norm.weight"] = (s.q_lora_rank,)
            shapes[p + "attn_q_b.weight"] = (s.num_heads * s.qk_head_dim, s.q_lora_rank)
        else:
            shapes[p + "attn_q.weight"] = (s.num_heads * s.qk_head_dim, H)
        shapes[p + "attn_kv_a_mqa.weight"] = (s.kv_lora_rank + s.qk_rope_head_dim, H)
        shapes[p + "attn_kv_a_norm.weight"] = (s.kv_lora_rank,)
        if s.layout == "mla":
            shapes[p + "attn_k_b.weight"] = (s.num_heads, s.kv_lora_rank, s.qk_nope_head_dim)
            shapes[p + "attn_v_b.weight"] = (s.num_heads, s.v_head_dim, s.kv_lora_rank)
        else:
            shapes[p + "attn_kv_b.weight"] = (
                s.num_heads * (s.qk_nope_head_dim + s.v_head_dim),
                s.kv_lora_rank,
            )
        shapes[p + "attn_output.weight"] = (H, s.num_heads * s.v_head_dim)
        if s.has_indexer:
            shapes.update(_indexer_shapes(p, s))
        shapes[p + "ffn_norm.weight"] = (H,)
        if not s.is_moe_layer(i):
            shapes[p + "ffn_gate.weight"] = (s.intermediate_size, H)
            shapes[p + "ffn_up.weight"] = (s.intermediate_size, H)
            shapes[p + "ffn_down.weight"] = (H, s.intermediate_size)
            continue
        E, I = s.num_experts, s.moe_intermediate_size
        shapes[p + "ffn_gate_inp.weight"] = (E, H)
        if s.is_v3:
            shapes[p + "exp_probs_b.bias"] = (E,)
        if s.fused_gate_up_experts:
            shapes[p + "ffn_gate_up_exps.weight"] = (E, 2 * I, H)
        else:
            shapes[p + "ffn_gate_exps.weight"] = (E, I, H)
            shapes[p + "ffn_up_exps.weight"] = (E, I, H)
        shapes[p + "ffn_down_exps.weight"] = (E, H, I)
        if s.num_shared_experts:
            Is = I * s.num_shared_experts
            shapes[p + "ffn_gate_shexp.weight"] = (Is, H)
            shapes[p + "ffn_up_shexp.weight"] = (Is, H)
            shapes[p + "ffn_down_shexp.weight"] = (H, Is)
    return shapes


def _indexer_shapes(p: str, s: ModelSpec) -> dict[str, Shape]:
    """deepseek32's lightning indexer of one layer (llama.cpp's INDEXER_* tensors)."""
    D = s.index_head_dim
    assert s.q_lora_rank is not None  # _check_spec: deepseek32 has q_lora
    return {
        p + "indexer.k_norm.weight": (D,),  # a LayerNorm (eps 1e-6): weight and bias
        p + "indexer.k_norm.bias": (D,),
        p + "indexer.proj.weight": (s.index_n_heads, s.hidden_size),  # per-head weights
        p + "indexer.attn_k.weight": (D, s.hidden_size),  # one key head, from x
        p + "indexer.attn_q_b.weight": (s.index_n_heads * D, s.q_lora_rank),  # from q_a latent
    }


def check_tensors(gguf: GGUFModelFile, spec: ModelSpec | V4Spec) -> None:
    """Every expected tensor is present with the shape the metadata implies."""
    for name, shape in expected_gguf_shapes(spec).items():
        if not gguf.has_tensor(name):
            if name.endswith("exp_probs_b.bias"):
                continue  # optional: older V3 conversions lack it; the bias is then zero
            raise GGUFError(f"{gguf.path}: tensor {name} is missing; the file is incomplete")
        actual = gguf.tensor_infos[name][0].shape
        if tuple(actual) != shape:
            raise GGUFError(
                f"{gguf.path}: tensor {name} has shape {list(actual)} but the metadata implies "
                f"{list(shape)}; the file does not match its own header"
            )


# GGUF per-layer suffix -> transformers parameter path inside `model.layers.{i}`.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    # deepseek32 (convert_hf_to_gguf: DeepseekV32Model; gguf-py tensor_mapping "DSA")
    "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",
    "indexer.k_norm.bias": "self_attn.indexer.k_norm.bias",
    "indexer.proj.weight": "self_attn.indexer.weights_proj.weight",
    "indexer.attn_k.weight": "self_attn.indexer.wk.weight",
    "indexer.attn_q_b.weight": "self_attn.indexer.wq_b.weight",
}


def kv_b_from_mla(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """Rebuild `kv_b_proj.weight` [heads*(nope+v), kv_lora] from the MLA layout's halves.

    k_b: [heads, kv_lora, nope]  v_b: [heads, v, kv_lora]; head h's rows are k_b[h].T then v_b[h].
    """
    return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])



_HF_TO_GGUF_SUFFIX = {hf: suffix for suffix, hf in _LAYER_NAMES.items()}


def gguf_sources(hf_name: str, spec: ModelSpec | V4Spec) -> tuple[str, ...]:
    """The GGUF tensors a transformers parameter is built from (for memory planning)."""
    if isinstance(spec, V4Spec):
        return v4_gguf_sources(hf_name)
    if hf_name == "model.embed_tokens.weight":
        return ("token_embd.weight",)
    if hf_name == "model.norm.weight":
        return ("output_norm.weight",)
    if hf_name == "lm_head.weight":
        return ("token_embd.weight",) if spec.tied_embeddings else ("output.weight",)
    _prefix, _, rest = hf_name.partition(".layers.")
    layer, _, leaf = rest.partition(".")
    p = f"blk.{layer}."
    if leaf == "self_attn.kv_b_proj.weight" and spec.layout == "mla":
        return (p + "attn_k_b.weight", p + "attn_v_b.weight")
    if leaf == "mlp.experts.gate_up_proj":
        if spec.fused_gate_up_experts:
            return (p + "ffn_gate_up_exps.weight",)
        return (p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight")
    if leaf in _HF_TO_GGUF_SUFFIX:
        return (p + _HF_TO_GGUF_SUFFIX[leaf],)
    raise KeyError(hf_name)


def load_hf_weight(gguf: GGUFModelFile, spec: ModelSpec | V4Spec, hf_name: str) -> torch.Tensor:
    """One transformers parameter as fp32 (an integer table as int64), built from its GGUF
    source tensor(s)."""
    sources = [s for s in gguf_sources(hf_name, spec) if gguf.has_tensor(s)]
    if not sources and hf_name.endswith("e_score_correction_bias"):
        return torch.zeros(spec.num_experts)
    combine = combine_v4_sources if isinstance(spec, V4Spec) else combine_sources
    return combine(hf_name, [gguf.tensor(s).dequantize() for s in sources])


def combine_sources(hf_name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """One parameter from its dequantized GGUF source tensors (see gguf_sources)."""
    if hf_name.endswith("kv_b_proj.weight") and len(parts) == 2:
        return kv_b_from_mla(*parts)
    if hf_name.endswith("experts.gate_up_proj") and len(parts) == 2:
        return torch.cat(parts, dim=1)  # [E, 2I, H], gate rows first
    (tensor,) = parts
    return tensor
