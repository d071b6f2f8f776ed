"""Vectorized torch dequantization of GGML blocks.

Each `_dequant_*` takes `blocks: [N, type_size] uint8` (N whole blocks) and returns
`[N, block_size] float32`. The math follows ggml's reference dequantizers exactly (products are
formed in fp32 in the same order), so results equal `gguf.quants.dequantize` bit for bit or to
within one fp32 rounding. `tests/test_dequant.py` checks every type against gguf-py on random
blocks. The i-quants, and MXFP4 (level-table codes like IQ4_NL's), live in dequant_iquants.py.
"""

from __future__ import annotations

import numpy as np
import torch

from hybrid.errors import GGUFError
from hybrid.gguf.dequant_iquants import IQUANT_DEQUANT
from hybrid.gguf.quant_types import SUPPORTED_TYPES, Q, block_geometry, supported_names, type_name


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The little-endian fp16 at byte `start` of every block, as fp32: [N, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (qs & 0x0F), (qs >> 4)


def _dequant_q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    q = b[:, 2:].contiguous().view(torch.int8).to(torch.float32)  # [N, 32]
    return d * q


def _dequant_q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    lo, hi = _nibbles(b[:, 2:18])
    q = torch.cat([lo, hi], dim=1).to(torch.float32) - 8.0  # [N, 32]
    return d * q


def _dequant_q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b, 0), _f16(b, 2)
    lo, hi = _nibbles(b[:, 4:20])
    q = torch.cat([lo, hi], dim=1).to(torch.float32)
    return d * q + m


def _q5_high_bits(qh_bytes: torch.Tensor) -> torch.Tensor:
    """Bit j of the little-endian uint32 `qh`, for j in 0..31: [N, 32] uint8."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh_bytes.device)
    bits = (qh_bytes.unsqueeze(-1) >> shifts) & 1  # [N, 4, 8]
    return bits.reshape(qh_bytes.shape[0], 32)


def _dequant_q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    hb = _q5_high_bits(b[:, 2:6])
    lo, hi = _nibbles(b[:, 6:22])
    q = (torch.cat([lo, hi], dim=1) | (hb << 4)).to(torch.float32) - 16.0
    return d * q


def _dequant_q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b, 0), _f16(b, 2)
    hb = _q5_high_bits(b[:, 4:8])
    lo, hi = _nibbles(b[:, 8:24])
    q = (torch.cat([lo, hi], dim=1) | (hb << 4)).to(torch.float32)
    return d * q + m


def _k4_scales_mins(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte 6-bit scales and mins of Q4_K/Q5_K: two [N, 8] fp32 tensors."""
    s = s.to(torch.int32)
    sc_lo = s[:, 0:4] & 63
    mn_lo = s[:, 4:8] & 63
    sc_hi = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn_hi = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    scales = torch.cat([sc_lo, sc_hi], dim=1).to(torch.float32)
    mins = torch.cat([mn_lo, mn_hi], dim=1).to(torch.float32)
    return scales, mins


def _dequant_q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    scales, mins = _k4_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(n, 4, 32)  # 4 chunks of 64 values
    lo, hi = _nibbles(qs)
    q = torch.stack([lo, hi], dim=2).reshape(n, 8, 32).to(torch.float32)  # sub-block j = 2c + half
    out = (d * scales).unsqueeze(-1) * q - (dmin * mins).unsqueeze(-1)
    return out.reshape(n, 256)


def _dequant_q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    scales, mins = _k4_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]  # [N, 32]: bit j of qh[l] is the 5th bit of element l of sub-block j
    qs = b[:, 48:176].reshape(n, 4, 32)
    lo, hi = _nibbles(qs)
    q4 = torch.stack([lo, hi], dim=2).reshape(n, 8, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    high = (qh.unsqueeze(1) >> shifts) & 1  # [N, 8, 32]
    q = (q4 | (high << 4)).to(torch.float32)
    out = (d * scales).unsqueeze(-1) * q - (dmin * mins).unsqueeze(-1)
    return out.reshape(n, 256)


def _dequant_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 64)
    qh = b[:, 128:192].reshape(n, 2, 32)
    sc = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32).reshape(n, 2, 8)
    d = _f16(b, 208)
    # Per 128-element half: four runs of 32 (l, l+32, l+64, l+96).
    q1 = (ql[:, :, 0:32] & 0x0F) | (((qh >> 0) & 3) << 4)
    q2 = (ql[:, :, 32:64] & 0x0F) | (((qh >> 2) & 3) << 4)
    q3 = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    q = torch.stack([q1, q2, q3, q4], dim=2).to(torch.float32) - 32.0  # [N, 2, 4, 32]
    # Scale index within a half: 2 * run + (l >= 16).
    scale = sc.reshape(n, 2, 4, 2, 1).expand(n, 2, 4, 2, 16).reshape(n, 2, 4, 32)
    return (d.view(n, 1, 1, 1) * scale * q).reshape(n, 256)


def _dequant_q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc = b[:, 0:16].reshape(n, 2, 4, 2)  # [half, shift, 16-group]
    qs = b[:, 16:80].reshape(n, 2, 1, 32)
    d, dmin = _f16(b, 80), _f16(b, 82)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    q = ((qs >> shifts) & 3).to(torch.float32).reshape(n, 2, 4, 2, 16)
    dl = d.view(n, 1, 1, 1) * (sc & 0x0F).to(torch.float32)
    ml = dmin.view(n, 1, 1, 1) * (sc >> 4).to(torch.float32)
    out = dl.unsqueeze(-1) * q - ml.unsqueeze(-1)
    return out.reshape(n, 256)


def _dequant_q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask = b[:, 0:32].reshape(n, 1, 1, 32)
    qs = b[:, 32:96].reshape(n, 2, 1, 32)
    s = b[:, 96:108].to(torch.int32)
    d = _f16(b, 108)
    # 16 six-bit scales: low 4 bits from bytes 0..7 (low nibble first), high 2 bits from 8..11.
    low = torch.cat([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], dim=1)  # [N, 16]
    i = torch.arange(16, device=b.device)
    high = (s[:, 8 + (i % 4)] >> (2 * (i // 4))) & 3
    scales = ((low | (high << 4)) - 32).to(torch.float32).reshape(n, 2, 4, 2)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    q2 = ((qs >> shifts) & 3).to(torch.int32)  # [N, 2, 4, 32]
    # The high bit comes from hmask bit (4 * half + shift index); a clear bit subtracts 4.
    bit = torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 2, 4, 1)
    hbit = ((hmask >> bit) & 1).to(torch.int32)
    q = (q2 - 4 * (1 - hbit)).to(torch.float32).reshape(n, 2, 4, 2, 16)
    out = (d.view(n, 1, 1, 1) * scales).unsqueeze(-1) * q
    return out.reshape(n, 256)


_BLOCK_DEQUANT = {
    Q.Q8_0: _dequant_q8_0,
    Q.Q4_0: _dequant_q4_0,
    Q.Q4_1: _dequant_q4_1,
    Q.Q5_0: _dequant_q5_0,
    Q.Q5_1: _dequant_q5_1,
    Q.Q2_K: _dequant_q2_k,
    Q.Q3_K: _dequant_q3_k,
    Q.Q4_K: _dequant_q4_k,
    Q.Q5_K: _dequant_q5_k,
    Q.Q6_K: _dequant_q6_k,
    **IQUANT_DEQUANT,
}

# Blocks dequantized per chunk: bounds the temporaries to a few hundred MB for huge tensors.
_CHUNK_BLOCKS = 1 << 18


def dequantize(raw: np.ndarray | torch.Tensor, qtype: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Dequantize raw GGML data to an fp32 tensor of `shape` (numpy order, rows last).

    `raw` is the tensor's bytes (any shape, uint8) or, for F32/F16/BF16, its elements. An
    I32 tensor (an integer table, not weights) comes back as int32.
    """
    if qtype not in SUPPORTED_TYPES:
        raise GGUFError(
            f"tensor type {type_name(qtype)} is not supported; supported types: {supported_names()}"
        )
    flat = _as_uint8(raw)
    if qtype == Q.I32:  # an integer table (DeepSeek-V4's token-id routing): stays int32
        return flat.view(torch.int32).reshape(shape).clone()
    if qtype == Q.F32:
        return flat.view(torch.float32).reshape(shape).clone()
    if qtype == Q.F16:
        return flat.view(torch.float16).to(torch.float32).reshape(shape)
    if qtype == Q.BF16:
        return flat.view(torch.bfloat16).to(torch.float32).reshape(shape)
    block_size, type_size = block_geometry(qtype)
    blocks = flat.reshape(-1, type_size)
    fn = _BLOCK_DEQUANT[Q(qtype)]
    out = torch.empty(blocks.shape[0], block_size, dtype=torch.float32, device=blocks.device)
    for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        stop = start + _CHUNK_BLOCKS
        out[start:stop] = fn(blocks[start:stop])
    return out.reshape(shape)


def _as_uint8(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        return raw.reshape(-1).view(torch.uint8)
    arr = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if not arr.flags.writeable:
        # torch wants writable memory; memory-mapped GGUF data is read-only, so copy this slice.
        arr = arr.copy()
    return torch.from_numpy(arr)
