"""Which GGML type each tensor gets for a `--quant` choice, following llama.cpp's recipes.

Q4_K_M (llama.cpp's `llama_tensor_get_type` for deepseek2): Q4_K everywhere; Q6_K for `output`,
and for the ffn_down family and `attn_kv_b` in the "more bits" layers (i < n/8, i >= 7n/8, or
(i - n/8) % 3 == 2). 1-D tensors and `ffn_gate_inp` stay F32. A tensor whose rows (ne0) are not
a multiple of the type's block falls back: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and to F16
when even 32 does not divide them.

Q2_K (llama.cpp's `LLAMA_FTYPE_MOSTLY_Q2_K` for a model with more than 8 experts): Q2_K
everywhere; Q3_K for the ffn_down family and `attn_output`, Q6_K for `output`. Its routed experts
(gate/up Q2_K, down Q3_K) are the types the unsloth Q2_K mixes of DeepSeek put on the experts,
which is what this recipe is for: the other tensors of those mixes are not modelled. Q2_K and
Q3_K fall back to Q4_0 (llama.cpp picks IQ4_NL, which hybrid does not read).
"""

from __future__ import annotations

import re

from hybrid.errors import HybridError
from hybrid.gguf.quant_types import Q, block_geometry

QUANTS = ("f32", "f16", "bf16", "q8_0", "q4_k_m", "q2_k")
# llama.cpp's LLAMA_FTYPE values, written as general.file_type.
FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_k_m": 15, "q2_k": 10}
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, shape: tuple[int, ...], num_layers: int, quant: str) -> int:
    """The GGML type of tensor `name` (numpy-order `shape`) in a `quant` file."""
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
    if name == "output.weight":
        return with_fallback(Q.Q6_K if shape[-1] % 256 == 0 else Q.Q8_0, shape[-1])
    if quant == "q2_k":
        qtype = Q.Q3_K if "ffn_down" in name or "attn_output" in name else Q.Q2_K
        return with_fallback(qtype, shape[-1])
    qtype = Q.Q4_K
    m = _LAYER_RE.match(name)
    layer = int(m.group(1)) if m else -1
    if ("ffn_down" in name or "attn_kv_b" in name) and use_more_bits(layer, num_layers):
        qtype = Q.Q6_K
    return with_fallback(qtype, shape[-1])


def with_fallback(qtype: int, row_len: int) -> int:
    block_size, _ = block_geometry(qtype)
    if row_len % block_size == 0:
        return qtype
    fallback = _FALLBACK.get(Q(qtype), Q.F16)
    if row_len % block_geometry(fallback)[0]:
        return Q.F16
    return fallback
