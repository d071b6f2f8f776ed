"""`hybrid make-model`: write a synthetic DeepSeek GGUF (deepseek2 or deepseek32), streaming.

The file is what llama.cpp's converter and quantizer would write for a real model of these
shapes: the same metadata keys, tensor names, layouts (legacy `attn_kv_b` or MLA
`attn_k_b`/`attn_v_b`), quant recipe and split naming. Weights are random but deterministic in
`seed`: every chunk draws from its own generator keyed by (seed, tensor name, chunk), so the
bytes do not depend on chunking or on the split count. At most one chunk (<= ~256 MB) is in
memory at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from hybrid.errors import HybridError
from hybrid.model.spec import ARCH_V32, ModelSpec
from hybrid.model.tensor_map import expected_gguf_shapes
from hybrid.synth.presets import Preset
from hybrid.synth.recipe import FILE_TYPES, tensor_type
from hybrid.synth.router_skew import check_skew, layer_bias
from hybrid.synth.streaming import add_tokenizer, random_matrix_chunks, tensor_rng, write_model
from hybrid.synth.vocab import Vocab


@dataclass(frozen=True)
class MakeModelOptions:
    preset: Preset
    quant: str = "q4_k_m"
    layout: str = "legacy"  # or "mla"
    seed: int = 0
    split: int = 1
    vocab: str = "small"  # "deepseek" (129,280 ids) or "small" (preset.vocab_size ids)
    # Write headers only and extend each file to its full size as a sparse hole: a full-size
    # model for planning (`hybrid rules explain`) that takes no disk space and cannot be run.
    header_only: bool = False
    # A bundled family's real chat template (deepseek-r1, kimi-k2, ...) or a .jinja file,
    # written as the file's tokenizer.chat_template; None: the vocabulary's built-in one.
    chat_template: str | None = None
    # Zipf exponent of each layer's expert choice frequencies (router_skew.py); 0: as drawn.
    router_skew: float = 0.0


def spec_for(preset: Preset, layout: str, vocab_size: int) -> ModelSpec:
    p = preset
    rope_scaling = {"rope_type": "yarn", "factor": p.rope_factor} if p.yarn else None
    return ModelSpec(
        num_layers=p.num_layers, hidden_size=p.hidden_size, intermediate_size=p.intermediate_size,
        moe_intermediate_size=p.moe_intermediate_size, num_heads=p.num_heads,
        q_lora_rank=p.q_lora_rank, kv_lora_rank=p.kv_lora_rank,
        qk_nope_head_dim=p.qk_nope_head_dim, qk_rope_head_dim=p.qk_rope_head_dim,
        v_head_dim=p.v_head_dim, vocab_size=vocab_size, first_k_dense=p.first_k_dense,
        num_experts=p.num_experts, num_experts_per_tok=p.num_experts_per_tok,
        num_shared_experts=p.num_shared_experts, routed_scaling_factor=p.routed_scaling_factor,
        norm_topk_prob=p.norm_topk_prob, scoring_func="sigmoid" if p.sigmoid_gating else "softmax",
        n_group=p.n_group, topk_group=p.topk_group, rms_norm_eps=1e-6, rope_theta=p.rope_theta,
        rope_scaling=rope_scaling, context_length=p.context_length, layout=layout,
        tied_embeddings=False, fused_gate_up_experts=False, name=p.name, arch=p.arch,
        index_n_heads=p.index_n_heads, index_head_dim=p.index_head_dim, index_topk=p.index_topk,
    )


def weight_std(name: str, shape: tuple[int, ...], spec: ModelSpec) -> float:
    """Spread of each tensor's weights: activations stay O(1) through all layers and greedy
    decoding does not collapse onto one token."""
    fan_in = shape[-1]
    if name == "token_embd.weight":
        return 1.0
    if name == "output.weight":
        return 3.0 / math.sqrt(fan_in)
    if "ffn_gate_inp" in name:
        return 2.0 / math.sqrt(fan_in)
    base = 1.0 / math.sqrt(fan_in)
    if "ffn_down_exps" in name:
        # Routed experts at half weight: a routing near-tie that flips under llama.cpp's 8-bit
        # activations then moves the logits by a bounded amount, so the oracle comparisons of
        # quantized files measure arithmetic, not the chaos of a random router.
        return 0.5 * base / math.sqrt(2 * spec.num_layers)
    if "attn_output" in name or "ffn_down" in name:
        return base / math.sqrt(2 * spec.num_layers)  # residual branches, GPT-2 style
    return base


def _chunks(name: str, shape: tuple[int, ...], qtype: int, spec: ModelSpec, seed: int,
            router_skew: float = 0.0) -> Iterator[np.ndarray]:
    """The tensor's data in file order, chunk by chunk."""
    if len(shape) == 1:
        rng = tensor_rng(seed, name, 0)
        if name.endswith("exp_probs_b.bias") and router_skew > 0:
            layer = int(name.split(".")[1])  # blk.N.exp_probs_b.bias
            yield layer_bias(layer, spec.num_experts, spec.num_experts_per_tok, spec.n_group,
                             spec.topk_group, router_skew, seed)
        elif name.endswith("exp_probs_b.bias"):
            yield (rng.standard_normal(shape[0], dtype=np.float32) * 0.05).astype(np.float32)
        elif name.endswith("k_norm.bias"):  # the indexer's LayerNorm bias: around 0
            yield (0.1 * rng.standard_normal(shape[0], dtype=np.float32)).astype(np.float32)
        else:  # norm weights: around 1
            yield (1.0 + 0.1 * rng.standard_normal(shape[0], dtype=np.float32)).astype(np.float32)
        return
    yield from random_matrix_chunks(seed, name, qtype, shape, weight_std(name, shape, spec))


def _add_metadata(w: GGUFWriter, p: Preset, opts: MakeModelOptions, vocab: Vocab) -> None:
    k = p.arch
    w.add_name(f"hybrid synthetic {p.name} ({opts.quant}, {opts.layout}, seed {opts.seed})")
    w.add_file_type(FILE_TYPES[opts.quant])
    w.add_quantization_version(2)
    w.add_uint32(f"{k}.block_count", p.num_layers)
    w.add_uint32(f"{k}.context_length", p.context_length)
    w.add_uint32(f"{k}.embedding_length", p.hidden_size)
    w.add_uint32(f"{k}.feed_forward_length", p.intermediate_size)
    w.add_uint32(f"{k}.attention.head_count", p.num_heads)
    w.add_float32(f"{k}.rope.freq_base", p.rope_theta)
    w.add_float32(f"{k}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{k}.expert_used_count", p.num_experts_per_tok)
    w.add_uint32(f"{k}.expert_count", p.num_experts)
    w.add_uint32(f"{k}.leading_dense_block_count", p.first_k_dense)
    w.add_uint32(f"{k}.vocab_size", len(vocab))
    if p.q_lora_rank is not None:
        w.add_uint32(f"{k}.attention.q_lora_rank", p.q_lora_rank)
    w.add_uint32(f"{k}.attention.kv_lora_rank", p.kv_lora_rank)
    qk, v = p.qk_nope_head_dim + p.qk_rope_head_dim, p.v_head_dim
    if opts.layout == "mla":
        w.add_uint32(f"{k}.attention.head_count_kv", 1)
        w.add_uint32(f"{k}.attention.key_length", p.kv_lora_rank + p.qk_rope_head_dim)
        w.add_uint32(f"{k}.attention.value_length", p.kv_lora_rank)
        w.add_uint32(f"{k}.attention.key_length_mla", qk)
        w.add_uint32(f"{k}.attention.value_length_mla", v)
    else:
        w.add_uint32(f"{k}.attention.head_count_kv", p.num_heads)
        w.add_uint32(f"{k}.attention.key_length", qk)
        w.add_uint32(f"{k}.attention.value_length", v)
    w.add_uint32(f"{k}.expert_feed_forward_length", p.moe_intermediate_size)
    w.add_uint32(f"{k}.expert_shared_count", p.num_shared_experts)
    w.add_float32(f"{k}.expert_weights_scale", p.routed_scaling_factor)
    if p.sigmoid_gating:  # V2 files carry neither key (softmax, no normalization)
        w.add_bool(f"{k}.expert_weights_norm", p.norm_topk_prob)
        w.add_uint32(f"{k}.expert_gating_func", 2)
    if p.n_group > 1:
        w.add_uint32(f"{k}.expert_group_count", p.n_group)
        w.add_uint32(f"{k}.expert_group_used_count", p.topk_group)
    w.add_uint32(f"{k}.rope.dimension_count", p.qk_rope_head_dim)
    if p.yarn:
        w.add_string(f"{k}.rope.scaling.type", "yarn")
        w.add_float32(f"{k}.rope.scaling.factor", p.rope_factor)
        w.add_uint32(f"{k}.rope.scaling.original_context_length", 4096)
        w.add_float32(f"{k}.rope.scaling.yarn_log_multiplier", p.yarn_log_multiplier)
    if p.arch == ARCH_V32:  # convert_hf_to_gguf's DeepseekV32Model (no MTP block written)
        w.add_uint32(f"{k}.attention.indexer.head_count", p.index_n_heads)
        w.add_uint32(f"{k}.attention.indexer.key_length", p.index_head_dim)
        w.add_uint32(f"{k}.attention.indexer.top_k", p.index_topk)
    # DeepSeek-V3.2 ships no chat template (a Python encoder instead): its conversions carry none
    add_tokenizer(w, vocab, opts.chat_template,
                  write_template=p.arch != ARCH_V32 or opts.chat_template is not None)


def make_model(opts: MakeModelOptions, vocab: Vocab, out: Path,
               progress: Callable[[str, int, int], None] | None = None) -> list[Path]:
    """Write the model to `out` (a .gguf path; split parts are named from it). Returns the files."""
    if opts.layout not in ("legacy", "mla"):
        raise HybridError(f"unknown --layout {opts.layout!r}; choose legacy or mla")
    if opts.preset.arch == ARCH_V32 and opts.layout != "mla":
        raise HybridError(f"{opts.preset.name} is deepseek32, which llama.cpp loads only in the "
                          "MLA layout: pass --layout mla")
    if opts.split < 1:
        raise HybridError(f"--split must be at least 1, got {opts.split}")
    check_skew(opts.router_skew, opts.preset.sigmoid_gating, opts.preset.name)
    spec = spec_for(opts.preset, opts.layout, len(vocab))
    shapes = expected_gguf_shapes(spec)
    types = {n: tensor_type(n, s, spec.num_layers, opts.quant, spec.first_k_dense)
             for n, s in shapes.items()}
    if opts.split > len(shapes):
        raise HybridError(f"--split {opts.split} is more than the model's {len(shapes)} tensors")
    out.parent.mkdir(parents=True, exist_ok=True)
    per_file = math.ceil(len(shapes) / opts.split) if opts.split > 1 else 0
    writer = GGUFWriter(out, opts.preset.arch, split_max_tensors=per_file)
    _add_metadata(writer, opts.preset, opts, vocab)
    return write_model(writer, out, shapes, types,
                       lambda name, shape, qtype: _chunks(name, shape, qtype, spec, opts.seed,
                                                          opts.router_skew),
                       opts.header_only, progress)
