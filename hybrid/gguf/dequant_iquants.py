"""Vectorized torch dequantization of the i-quant blocks (IQ1_S .. IQ4_XS), and of MXFP4, whose
4-bit codes select levels from a table in IQ4_NL's nibble order.

Same contract as hybrid.gguf.dequant: `blocks: [N, type_size] uint8` -> `[N, block_size]`
float32, equal to gguf-py's dequantizers (products in fp32 in ggml's order). The grids and sign
tables are the ones the CPU kernels use (cpu_kernels/formats/iquant_tables.py, generated from gguf-py),
so both paths read the same numbers. Layouts are described in cpu_kernels/exact/iquant_grid_dots.py,
iquant1_dots.py and iquant4_dots.py.
"""

from __future__ import annotations

from functools import cache

import torch

from cpu_kernels.formats import iquant_tables as tables
from cpu_kernels.formats.scalars import E8M0_HALF
from hybrid.gguf.quant_types import Q


@cache
def _table(name: str, device: torch.device) -> torch.Tensor:
    """An int8 table of cpu_kernels.formats.iquant_tables as fp32 on `device` (made once per device)."""
    return torch.from_numpy(getattr(tables, name)).to(device=device, dtype=torch.float32)


def _little_endian(b: torch.Tensor, start: int, count: int, width: int) -> torch.Tensor:
    """`count` unsigned little-endian ints of `width` bytes from byte `start`: [N, count] int64
    (built from the bytes: a view would need the slice aligned to the int's size)."""
    parts = b[:, start:start + width * count].to(torch.int64).view(b.shape[0], count, width)
    return (parts << (8 * torch.arange(width, device=b.device))).sum(-1)


def _u16(b: torch.Tensor, start: int, count: int) -> torch.Tensor:
    return _little_endian(b, start, count, 2)


def _u32(b: torch.Tensor, start: int, count: int) -> torch.Tensor:
    return _little_endian(b, start, count, 4)


def _half(bits: torch.Tensor) -> torch.Tensor:
    """f16 bit patterns [N, k] int64 -> fp32."""
    return bits.to(torch.int32).to(torch.int16).view(torch.float16).to(torch.float32)


def _f16(b: torch.Tensor, start: int) -> torch.Tensor:
    return _half(_u16(b, start, 1))  # [N, 1]


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """[N, n] bytes -> [N, 2n] nibbles, low first within each byte."""
    b = b.to(torch.int64)
    return torch.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)


def _bits(b: torch.Tensor) -> torch.Tensor:
    """[N, n] bytes -> [N, 8n] bits (0/1), bit j of byte i at 8 i + j."""
    shifts = torch.arange(8, device=b.device)
    return ((b.to(torch.int64).unsqueeze(-1) >> shifts) & 1).reshape(b.shape[0], -1)


def _sign_runs(b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """ksigns patterns: 7-bit indices [N, R] -> [N, R, 8] of +-1."""
    return _table("SIGNS", b.device)[index]


def _dequant_iq2_xxs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    w = _u32(b, 2, 16).reshape(n, 8, 2)
    codes = b[:, 2:].reshape(n, 8, 8)[:, :, 0:4].to(torch.int64)  # [N, 8 sub, 4 runs]
    signs = (w[:, :, 1:2] >> (7 * torch.arange(4, device=b.device))) & 127
    db = _f16(b, 0).view(n, 1) * (0.5 + (w[:, :, 1] >> 28).to(torch.float32)) * 0.25
    grid = _table("GRID_IQ2_XXS", b.device)[codes] * _sign_runs(b, signs)  # [N, 8, 4, 8]
    return (db.view(n, 8, 1, 1) * grid).reshape(n, 256)


def _dequant_iq2_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _u16(b, 2, 32)  # [N, 32 runs]
    grid = _table("GRID_IQ2_XS", b.device)[q & 511] * _sign_runs(b, q >> 9)
    sc = _nibbles(b[:, 66:74]).to(torch.float32)  # [N, 16], one per 16 elements
    db = _f16(b, 0) * (0.5 + sc) * 0.25
    return (db.view(n, 16, 1, 1) * grid.view(n, 16, 2, 8)).reshape(n, 256)


def _dequant_iq2_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    high = (b[:, 66:74].to(torch.int64).unsqueeze(-1) >> (2 * torch.arange(4, device=b.device))) & 3
    codes = b[:, 2:34].to(torch.int64) | (high.reshape(n, 32) << 8)
    signs = 1.0 - 2.0 * _bits(b[:, 34:66]).to(torch.float32).view(n, 32, 8)
    grid = _table("GRID_IQ2_S", b.device)[codes] * signs
    db = _f16(b, 0) * (0.5 + _nibbles(b[:, 74:82]).to(torch.float32)) * 0.25
    return (db.view(n, 16, 1, 1) * grid.view(n, 16, 2, 8)).reshape(n, 256)


def _dequant_iq3_xxs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    codes = b[:, 2:66].to(torch.int64)  # [N, 64] runs of 4
    w = _u32(b, 66, 8)  # [N, 8]
    signs = (w.unsqueeze(-1) >> (7 * torch.arange(4, device=b.device))) & 127  # [N, 8, 4]
    grid = _table("GRID_IQ3_XXS", b.device)[codes].view(n, 8, 4, 8) * _sign_runs(b, signs)
    db = _f16(b, 0) * (0.5 + (w >> 28).to(torch.float32)) * 0.5
    return (db.view(n, 8, 1, 1) * grid).reshape(n, 256)


def _dequant_iq3_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    codes = b[:, 2:66].to(torch.int64) | (_bits(b[:, 66:74]) << 8)  # [N, 64]
    signs = 1.0 - 2.0 * _bits(b[:, 74:106]).to(torch.float32)  # [N, 256]
    grid = _table("GRID_IQ3_S", b.device)[codes].reshape(n, 256) * signs
    db = _f16(b, 0) * (1 + 2 * _nibbles(b[:, 106:110])).to(torch.float32)  # [N, 8]
    return (db.view(n, 8, 1) * grid.view(n, 8, 32)).reshape(n, 256)


def _dequant_iq1_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qh = _u16(b, 34, 8)  # [N, 8]
    high = (qh.unsqueeze(-1) >> (3 * torch.arange(4, device=b.device))) & 7  # [N, 8, 4]
    codes = b[:, 2:34].to(torch.int64).view(n, 8, 4) | (high << 8)
    dl = _f16(b, 0) * (2 * ((qh >> 12) & 7) + 1).to(torch.float32)  # [N, 8]
    delta = torch.where((qh & 0x8000) == 0, 0.125, -0.125)
    grid = _table("GRID_IQ1_S", b.device)[codes]  # [N, 8, 4, 8]
    return (dl.view(n, 8, 1, 1) * (grid + delta.view(n, 8, 1, 1))).reshape(n, 256)


def _dequant_iq1_m(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    words = _u16(b, 48, 4)  # [N, 4]
    d_bits = ((words >> 12) << (4 * torch.arange(4, device=b.device))).sum(-1)
    d = _half(d_bits).view(n, 1)
    scales = (words.unsqueeze(-1) >> (3 * torch.arange(4, device=b.device))) & 7  # [N, 4, 4]
    dl = d * (2 * scales.reshape(n, 16) + 1).to(torch.float32)  # one per 16 elements
    nib = _nibbles(b[:, 32:48])  # [N, 32], one per run of 8
    codes = b[:, 0:32].to(torch.int64) | ((nib & 7) << 8)
    delta = torch.where((nib & 8) == 0, 0.125, -0.125)
    runs = _table("GRID_IQ1_S", b.device)[codes] + delta.unsqueeze(-1)  # [N, 32, 8]
    return (dl.view(n, 16, 1, 1) * runs.view(n, 16, 2, 8)).reshape(n, 256)


def _levels(q: torch.Tensor, table: str = "IQ4_LEVELS") -> torch.Tensor:
    """[N, 16 k] nibble bytes (byte j: element j low, 16 + j high) -> [N, 32 k] levels of
    `table`."""
    n = q.shape[0]
    q = q.to(torch.int64).view(n, -1, 16)
    idx = torch.cat([q & 15, q >> 4], -1).reshape(n, -1)
    return _table(table, q.device)[idx]


def _dequant_iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _levels(b[:, 2:18])


def _dequant_iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    high = (_u16(b, 2, 1) >> (2 * torch.arange(8, device=b.device))) & 3  # [N, 8]
    scales = (_nibbles(b[:, 4:8]) | (high << 4)) - 32
    dl = _f16(b, 0) * scales.to(torch.float32)
    return (dl.view(n, 8, 1) * _levels(b[:, 8:136]).view(n, 8, 32)).reshape(n, 256)


def _dequant_mxfp4(b: torch.Tensor) -> torch.Tensor:
    """Byte 0: the E8M0 exponent e; 1..16: codes of E2M1 values doubled (MXFP4_LEVELS), so the
    scale is 2^(e - 128) (cpu_kernels' E8M0_HALF, exact for every e), half the format's
    2^(e - 127). The products are exact, or inf past fp32's range (e = 254 and 255), as in
    ggml."""
    scale = torch.from_numpy(E8M0_HALF).to(b.device)[b[:, 0:1].to(torch.int64)]  # [N, 1]
    return scale * _levels(b[:, 1:17], "MXFP4_LEVELS")


IQUANT_DEQUANT = {Q.IQ1_S: _dequant_iq1_s, Q.IQ1_M: _dequant_iq1_m, Q.IQ2_XXS: _dequant_iq2_xxs,
                  Q.IQ2_XS: _dequant_iq2_xs, Q.IQ2_S: _dequant_iq2_s,
                  Q.IQ3_XXS: _dequant_iq3_xxs, Q.IQ3_S: _dequant_iq3_s,
                  Q.IQ4_NL: _dequant_iq4_nl, Q.IQ4_XS: _dequant_iq4_xs,
                  Q.MXFP4: _dequant_mxfp4}
