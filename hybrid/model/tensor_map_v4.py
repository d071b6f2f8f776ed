"""DeepSeek-V4's GGUF tensors (llama.cpp's `deepseek4` names) <-> transformers' parameters.

`expected_v4_shapes(spec)` lists every tensor the metadata implies (numpy order, `[out, in]`,
stacked experts `[E, out, in]`): llama.cpp's loader takes exactly these (a compressor only on
layers with a compress ratio, an indexer only on ratio-4 layers, a routing bias only on layers
that do not route by token id). Names map one to one (`conversion/deepseek.py`), nothing
transposed or permuted, except two: the split `ffn_gate_exps`/`ffn_up_exps` are
transformers' `gate_up_proj` (gate rows first), and the I32 token-id routing table is its
int64 `tid2eid` buffer.
"""

from __future__ import annotations

import torch

from hybrid.model.spec_v4 import V4Spec

Shape = tuple[int, ...]

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base",
    "output_hc_scale.weight": "model.hc_head.hc_scale",
}
# GGUF per-layer suffix -> transformers path inside `model.layers.{i}`
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn.weight": "attn_hc.fn",
    "hc_attn_base.weight": "attn_hc.base",
    "hc_attn_scale.weight": "attn_hc.scale",
    "hc_ffn_fn.weight": "ffn_hc.fn",
    "hc_ffn_base.weight": "ffn_hc.base",
    "hc_ffn_scale.weight": "ffn_hc.scale",
    "attn_sinks.weight": "self_attn.sinks",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv.weight": "self_attn.kv_proj.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_norm.weight",
    "attn_output_a.weight": "self_attn.o_a_proj.weight",
    "attn_output_b.weight": "self_attn.o_b_proj.weight",
    "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
    "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
    "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
    "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
    "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
    "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_tid2eid.weight": "mlp.gate.tid2eid",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
_HF_TO_GGUF = {hf: suffix for suffix, hf in LAYER_NAMES.items()}
_HF_GLOBAL_TO_GGUF = {hf: name for name, hf in GLOBAL_NAMES.items()}


def expected_v4_shapes(spec: V4Spec) -> dict[str, Shape]:
    s = spec
    H, V, C = s.hidden_size, s.vocab_size, s.hc_mult
    mix = (2 + C) * C  # a hyper-connection's pre (C), post (C) and C x C mixing weights
    shapes: dict[str, Shape] = {
        "token_embd.weight": (V, H), "output_norm.weight": (H,), "output.weight": (V, H),
        "output_hc_fn.weight": (C, C * H), "output_hc_base.weight": (C,),
        "output_hc_scale.weight": (1,)}
    D, E, I = s.head_dim, s.num_experts, s.moe_intermediate_size
    for i, ratio in enumerate(s.compress_ratios):
        p = f"blk.{i}."
        layer: dict[str, Shape] = {
            "attn_norm.weight": (H,), "ffn_norm.weight": (H,),
            "hc_attn_fn.weight": (mix, C * H), "hc_attn_base.weight": (mix,),
            "hc_attn_scale.weight": (3,), "hc_ffn_fn.weight": (mix, C * H),
            "hc_ffn_base.weight": (mix,), "hc_ffn_scale.weight": (3,),
            "attn_sinks.weight": (s.num_heads,),
            "attn_q_a.weight": (s.q_lora_rank, H), "attn_q_a_norm.weight": (s.q_lora_rank,),
            "attn_q_b.weight": (s.num_heads * D, s.q_lora_rank),
            "attn_kv.weight": (D, H), "attn_kv_a_norm.weight": (D,),
            # group g's rows are g * o_lora .. (g + 1) * o_lora, over its heads' columns
            "attn_output_a.weight": (s.o_groups * s.o_lora_rank, s.num_heads * D // s.o_groups),
            "attn_output_b.weight": (H, s.o_groups * s.o_lora_rank),
            "ffn_gate_inp.weight": (E, H),
            "ffn_gate_exps.weight": (E, I, H), "ffn_up_exps.weight": (E, I, H),
            "ffn_down_exps.weight": (E, H, I),
            "ffn_gate_shexp.weight": (I, H), "ffn_up_shexp.weight": (I, H),
            "ffn_down_shexp.weight": (H, I)}
        if ratio:  # CSA (4) compresses overlapping windows: two series, twice as wide
            width = (2 if ratio == 4 else 1) * D
            layer.update({"attn_compressor_kv.weight": (width, H),
                          "attn_compressor_gate.weight": (width, H),
                          "attn_compressor_ape.weight": (ratio, width),
                          "attn_compressor_norm.weight": (D,)})
        if ratio == 4:
            iD = s.index_head_dim
            layer.update({"indexer.attn_q_b.weight": (s.index_n_heads * iD, s.q_lora_rank),
                          "indexer.proj.weight": (s.index_n_heads, H),
                          "indexer_compressor_kv.weight": (2 * iD, H),
                          "indexer_compressor_gate.weight": (2 * iD, H),
                          "indexer_compressor_ape.weight": (4, 2 * iD),
                          "indexer_compressor_norm.weight": (iD,)})
        if s.is_hash_layer(i):
            layer["ffn_gate_tid2eid.weight"] = (V, s.num_experts_per_tok)
        else:
            layer["exp_probs_b.bias"] = (E,)
        shapes.update({p + k: v for k, v in layer.items()})
    return shapes


def v4_gguf_sources(hf_name: str) -> tuple[str, ...]:
    """The GGUF tensors a transformers parameter (or buffer) is built from."""
    if hf_name in _HF_GLOBAL_TO_GGUF:
        return (_HF_GLOBAL_TO_GGUF[hf_name],)
    _prefix, _, rest = hf_name.partition(".layers.")
    layer, _, leaf = rest.partition(".")
    p = f"blk.{layer}."
    if leaf == "mlp.experts.gate_up_proj":
        return (p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight")
    if leaf in _HF_TO_GGUF:
        return (p + _HF_TO_GGUF[leaf],)
    raise KeyError(hf_name)


def combine_v4_sources(hf_name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """One parameter from its GGUF tensors, dequantized (see v4_gguf_sources)."""
    if hf_name.endswith("experts.gate_up_proj"):
        return torch.cat(parts, dim=1)  # [E, 2I, H], gate rows first
    (tensor,) = parts
    if hf_name.endswith("tid2eid"):
        return tensor.long()  # [V, K] expert ids, I32 in the file
    return tensor
