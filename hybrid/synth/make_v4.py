"""`hybrid make-model` for DeepSeek-V4: a synthetic `deepseek4` GGUF as llama.cpp's converter
writes one (`conversion/deepseek.py`, `DeepseekV4Model`): its keys with the types its loader
insists on (u32, f32, an f32 array per layer for the SwiGLU clamps, an i32 array of compress
ratios), exactly the tensors it loads (tensor_map_v4.py) and the converter's types:

    f32        every tensor F32 (the token-id routing table I32)
    bf16       2-D weights BF16; norms, hyper-connections, sinks, position biases F32
    q8_0       2-D weights Q8_0; the same F32 ones
    mxfp4_moe  what the converter writes from DeepSeek's release: routed experts MXFP4, the
               FP8 weights (attention, shared experts, the indexer's query) Q8_0, the BF16
               ones (embeddings, output, router, compressors) BF16, the rest F32
    q4_k_m     a community requantization as llama-quantize's Q4_K_M recipe makes it (the
               deepseek2 one, recipe.py): 2-D weights Q4_K, Q6_K for the output and for
               ffn_down in the layers `use_more_bits` picks; the same F32 ones

Weights are random, drawn per tensor from (seed, name, chunk) as make_model.py's are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from hybrid.errors import HybridError
from hybrid.gguf.quant_types import Q
from hybrid.model.spec_v4 import GATING_SQRT_SOFTPLUS, V4Spec
from hybrid.model.tensor_map_v4 import expected_v4_shapes
from hybrid.synth.recipe import tensor_type, with_fallback
from hybrid.synth.streaming import add_tokenizer, random_matrix_chunks, tensor_rng, write_model
from hybrid.synth.vocab import Vocab

V4_QUANTS = {"f32": 0, "bf16": 32, "q8_0": 7, "mxfp4_moe": 38, "q4_k_m": 15}  # file_type
# tensors the converter keeps F32 whatever the mix (1-D ones aside)
_F32_ALWAYS = ("hc_", "_ape.", "attn_sinks")
# tensors DeepSeek's release holds in BF16 (the rest of its 2-D weights are FP8 -> Q8_0)
_BF16_IN_RELEASE = ("token_embd.", "output.", "ffn_gate_inp.", "compressor_kv.",
                    "compressor_gate.", "indexer.proj.")


def v4_tensor_type(name: str, shape: tuple[int, ...], quant: str, num_layers: int = 1) -> int:
    """The GGML type of V4 tensor `name` (numpy-order `shape`) in a `quant` file of
    `num_layers` layers."""
    if quant not in V4_QUANTS:
        raise HybridError(f"--quant {quant!r} has no DeepSeek-V4 recipe; choose one of "
                          f"{', '.join(V4_QUANTS)}")
    if "tid2eid" in name:
        return Q.I32
    if len(shape) < 2 or any(k in name for k in _F32_ALWAYS) or quant == "f32":
        return Q.F32
    if quant == "bf16":
        return Q.BF16
    if quant == "q8_0":
        return with_fallback(Q.Q8_0, shape[-1])
    if quant == "q4_k_m":
        return tensor_type(name, shape, num_layers, quant)
    if "_exps." in name:
        return with_fallback(Q.MXFP4, shape[-1])
    if any(k in name for k in _BF16_IN_RELEASE):
        return Q.BF16
    return with_fallback(Q.Q8_0, shape[-1])


def _std(name: str, shape: tuple[int, ...], spec: V4Spec) -> float:
    """Spreads that keep activations O(1) through the streams and the logits varied."""
    fan_in = shape[-1]
    base = 1.0 / math.sqrt(fan_in)
    if name == "token_embd.weight":
        return 1.0
    if name == "output.weight":
        return 3.0 * base
    if "hc_" in name and "fn" in name:
        return 0.02  # the hyper-connections' mixing logits stay near their biases
    if "_ape." in name:
        return 0.5
    if "ffn_gate_inp" in name:
        return 2.0 * base
    if "ffn_down_exps" in name:  # routing near-ties then move the logits a bounded amount
        return 0.5 * base / math.sqrt(2 * spec.num_layers)
    if "attn_output_b" in name or "ffn_down" in name:
        return base / math.sqrt(2 * spec.num_layers)
    return base


def _vector(name: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """1-D tensors: norms around 1, biases and sinks around 0, hyper-connection scales 1."""
    noise = rng.standard_normal(size, dtype=np.float32)
    if name.endswith("exp_probs_b.bias"):
        return (0.05 * noise).astype(np.float32)
    if "hc_" in name and "base" in name:
        return (0.1 * noise).astype(np.float32)
    if "attn_sinks" in name:
        return noise
    return (1.0 + 0.1 * noise).astype(np.float32)  # norm weights, hyper-connection scales


def _chunks(name: str, shape: tuple[int, ...], qtype: int, spec: V4Spec, seed: int
            ) -> Iterator[np.ndarray]:
    rng = tensor_rng(seed, name, 0)
    if qtype == Q.I32:  # [V, K]: each token's K distinct experts
        table = np.argsort(rng.random((shape[0], spec.num_experts)), axis=1)[:, :shape[1]]
        yield table.astype(np.int32)
        return
    if len(shape) == 1:
        yield _vector(name, shape[0], rng)
        return
    yield from random_matrix_chunks(seed, name, qtype, shape, _std(name, shape, spec))


def _add_metadata(w: GGUFWriter, spec: V4Spec, quant: str, seed: int) -> None:
    k, s, n = "deepseek4", spec, spec.num_layers
    w.add_name(f"hybrid synthetic {s.name} ({quant}, seed {seed})")
    w.add_file_type(V4_QUANTS[quant])
    w.add_quantization_version(2)
    for key, value in (("block_count", n), ("context_length", s.context_length),
                       ("embedding_length", s.hidden_size),
                       ("embedding_length_out", s.hc_mult * s.hidden_size),
                       ("vocab_size", s.vocab_size),
                       ("attention.head_count", s.num_heads), ("attention.head_count_kv", 1),
                       ("attention.key_length", s.head_dim),
                       ("attention.value_length", s.head_dim),
                       ("rope.dimension_count", s.qk_rope_head_dim),
                       ("attention.q_lora_rank", s.q_lora_rank),
                       ("attention.sliding_window", s.sliding_window),
                       ("expert_count", s.num_experts),
                       ("expert_used_count", s.num_experts_per_tok),
                       ("expert_gating_func", GATING_SQRT_SOFTPLUS),
                       ("expert_feed_forward_length", s.moe_intermediate_size),
                       ("expert_shared_count", 1),
                       ("attention.indexer.head_count", s.index_n_heads),
                       ("attention.indexer.key_length", s.index_head_dim),
                       ("attention.indexer.top_k", s.index_topk),
                       ("attention.output_group_count", s.o_groups),
                       ("attention.output_lora_rank", s.o_lora_rank),
                       ("hyper_connection.count", s.hc_mult),
                       ("hyper_connection.sinkhorn_iterations", s.hc_sinkhorn_iters),
                       ("hash_layer_count", s.num_hash_layers)):
        w.add_uint32(f"{k}.{key}", value)
    for key, value in (("rope.freq_base", s.rope_theta),
                       ("attention.layer_norm_rms_epsilon", s.rms_norm_eps),
                       ("expert_weights_scale", s.routed_scaling_factor),
                       ("attention.compress_rope_freq_base", s.compress_rope_theta),
                       ("hyper_connection.epsilon", s.hc_eps)):
        w.add_float32(f"{k}.{key}", value)
    w.add_bool(f"{k}.expert_weights_norm", True)
    # per layer, as floats (an int list would be written as INT32, which the loader refuses)
    w.add_array(f"{k}.swiglu_clamp_exp", [float(s.swiglu_limit)] * n)
    w.add_array(f"{k}.swiglu_clamp_shexp", [float(s.swiglu_limit)] * n)
    w.add_array(f"{k}.attention.compress_ratios", [int(r) for r in s.compress_ratios])
    if s.rope_scaling is not None:
        w.add_string(f"{k}.rope.scaling.type", "yarn")
        w.add_float32(f"{k}.rope.scaling.factor", s.rope_scaling["factor"])
        w.add_uint32(f"{k}.rope.scaling.original_context_length",
                     s.rope_scaling["original_max_position_embeddings"])


def make_v4(preset: V4Spec, quant: str, seed: int, vocab: Vocab, out: Path,
            header_only: bool = False, chat_template: str | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> list[Path]:
    """Write the deepseek4 model to `out` (one .gguf). Returns the files."""
    spec = dataclasses.replace(preset, vocab_size=len(vocab))
    shapes = expected_v4_shapes(spec)
    types = {name: v4_tensor_type(name, shape, quant, spec.num_layers) for name, shape in shapes.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(out, "deepseek4")
    _add_metadata(writer, spec, quant, seed)
    # V4 ships no chat template (a Python encoder instead): its conversions carry none
    add_tokenizer(writer, vocab, chat_template, write_template=chat_template is not None)
    return write_model(writer, out, shapes, types,
                       lambda name, shape, qtype: _chunks(name, shape, qtype, spec, seed),
                       header_only, progress)
