"""Which GGML type each tensor gets for a `--quant` choice, following llama.cpp's recipes and
the mixes people download.

Q4_K_M (llama.cpp's `llama_tensor_get_type` for deepseek2): Q4_K everywhere; Q6_K for `output`,
and for the ffn_down family and `attn_kv_b` in the "more bits" layers (i < n/8, i >= 7n/8, or
(i - n/8) % 3 == 2). 1-D tensors and `ffn_gate_inp` stay F32.

Q2_K (llama.cpp's `LLAMA_FTYPE_MOSTLY_Q2_K` for a model with more than 8 experts): Q2_K
everywhere; Q3_K for the ffn_down family and `attn_output`, Q6_K for `output`.

IQ4_XS (llama.cpp's `LLAMA_FTYPE_MOSTLY_IQ4_XS`, the type of bartowski's and others' V3/R1
IQ4_XS files): IQ4_XS everywhere, Q6_K for `output` (the deepseek2 rules that raise
attn_output apply only to 8-expert models).

The unsloth dynamic mixes (`ud-*`; unsloth's "Run DeepSeek R1 Dynamic 1.58-bit" post, Jan 2025,
and its table of MoE bits per file): the routed experts' gate/up in the low type, their down in
the "down_proj" column's types (a higher one in the first MoE layers), everything else as Q4_K_M
places it (attention and the dense layers at 4-6 bits) with the shared experts at Q6_K (the
post: "6bit"). The bits map to llama.cpp types: 1.56 = IQ1_S, 1.75 = IQ1_M, 2.06 = IQ2_XXS,
2.5 = IQ2_S, 2.625 = Q2_K, 3.44 = Q3_K. How many MoE layers get the higher down type is not
in the post; we take the first 3 (the files' own headers list every tensor's type and would
settle it; they cannot be read from here).

    ud-iq1_s    gate/up IQ1_S    down IQ2_XXS (first 3 MoE layers), IQ1_S    (131 GB R1)
    ud-iq1_m    gate/up IQ1_M    down IQ2_XXS                                (158 GB)
    ud-iq2_xxs  gate/up IQ2_XXS  down IQ2_S (first 3), IQ2_XXS               (183 GB)
    ud-q2_k_xl  gate/up Q2_K     down Q3_K (first 3), Q2_K                   (212 GB)

MXFP4_MOE (llama.cpp's `LLAMA_FTYPE_MOSTLY_MXFP4_MOE`, what its converter writes for DeepSeek-V4,
whose routed experts ship in FP4): the routed experts MXFP4, every other tensor Q8_0.

A tensor whose rows (ne0) are not a multiple of its type's block falls back as llama.cpp does:
Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, the 2-3 bit K-quants and the i-quants -> IQ4_NL,
and to F16 when even 32 does not divide them.
"""

from __future__ import annotations

import re

from hybrid.errors import HybridError
from hybrid.gguf.quant_types import Q, block_geometry

# --quant -> (routed gate/up, routed down in the first MoE layers, routed down elsewhere)
UD_MIXES = {
    "ud-iq1_s": (Q.IQ1_S, Q.IQ2_XXS, Q.IQ1_S),
    "ud-iq1_m": (Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XXS),
    "ud-iq2_xxs": (Q.IQ2_XXS, Q.IQ2_S, Q.IQ2_XXS),
    "ud-q2_k_xl": (Q.Q2_K, Q.Q3_K, Q.Q2_K),
}
UD_HIGH_DOWN_LAYERS = 3
QUANTS = ("f32", "f16", "bf16", "q8_0", "q4_k_m", "q2_k", "iq4_xs", "mxfp4_moe", *UD_MIXES)
# llama.cpp's LLAMA_FTYPE values, written as general.file_type (Q2_K_XL has none: Q2_K's).
FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_k_m": 15, "q2_k": 10,
              "iq4_xs": 30, "mxfp4_moe": 38, "ud-iq1_s": 24, "ud-iq1_m": 31, "ud-iq2_xxs": 19, "ud-q2_k_xl": 10}
_TO_IQ4_NL = (Q.Q2_K, Q.Q3_K, Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS,
              Q.IQ3_S, Q.IQ4_XS)
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.MXFP4: Q.Q8_0,
             **{t: Q.IQ4_NL for t in _TO_IQ4_NL}}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, shape: tuple[int, ...], num_layers: int, quant: str,
                first_k_dense: int = 0) -> int:
    """The GGML type of tensor `name` (numpy-order `shape`) in a `quant` file whose first
    `first_k_dense` layers are dense."""
    if quant not in QUANTS:
        raise HybridError(f"unknown --quant {quant!r}; choose one of {', '.join(QUANTS)}")
    if len(shape) < 2 or "ffn_gate_inp" in name or quant == "f32":
        return Q.F32
    if quant == "f16":
        return Q.F16
    if quant == "bf16":
        return Q.BF16
    if quant == "q8_0":
        return with_fallback(Q.Q8_0, shape[-1])
    if quant == "mxfp4_moe":
        return with_fallback(Q.MXFP4 if "_exps" in name else Q.Q8_0, shape[-1])
    if name == "output.weight":
        return with_fallback(Q.Q6_K if shape[-1] % 256 == 0 else Q.Q8_0, shape[-1])
    if quant == "q2_k":
        qtype = Q.Q3_K if "ffn_down" in name or "attn_output" in name else Q.Q2_K
        return with_fallback(qtype, shape[-1])
    if quant == "iq4_xs":
        return with_fallback(Q.IQ4_XS, shape[-1])
    m = _LAYER_RE.match(name)
    layer = int(m.group(1)) if m else -1
    if quant in UD_MIXES:
        mixed = _ud_type(name, layer, first_k_dense, UD_MIXES[quant])
        if mixed is not None:
            return with_fallback(mixed, shape[-1])
    qtype = Q.Q4_K
    if ("ffn_down" in name or "attn_kv_b" in name) and use_more_bits(layer, num_layers):
        qtype = Q.Q6_K
    return with_fallback(qtype, shape[-1])


def _ud_type(name: str, layer: int, first_k_dense: int, mix: tuple[int, int, int]) -> int | None:
    """The unsloth mix's type for a routed or shared expert tensor; None for the rest."""
    if "_shexp" in name:
        return Q.Q6_K
    if "_exps" not in name:
        return None
    gate_up, down_first, down_rest = mix
    if "ffn_down" not in name:
        return gate_up
    return down_first if layer < first_k_dense + UD_HIGH_DOWN_LAYERS else down_rest


def with_fallback(qtype: int, row_len: int) -> int:
    block_size, _ = block_geometry(qtype)
    if row_len % block_size == 0:
        return qtype
    fallback = _FALLBACK.get(Q(qtype), Q.F16)
    if row_len % block_geometry(fallback)[0]:
        return Q.F16
    return fallback
