"""Scalar field readers for GGUF blocks (numba), shared by every block kernel."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

f32 = np.float32
i32 = np.int32


@njit(inline="always", cache=True)
def f16_bits_to_f32(h: int) -> float:
    """IEEE half bits -> float32, exact (numba has no float16 type on the CPU)."""
    e = (h >> 10) & 31
    m = h & 1023
    if e == 0:
        v = math.ldexp(float(m), -24)
    elif e == 31:
        v = math.inf if m == 0 else math.nan
    else:
        v = math.ldexp(float(m + 1024), e - 25)
    return f32(-v if h & 0x8000 else v)


# float16 bits -> float32 value for all 65536 bit patterns (256 KiB, frozen into the kernels):
# one load per block scale instead of an exponent decode.
F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@njit(inline="always", cache=True)
def f16_at(row: np.ndarray, o: int) -> float:
    """The little-endian f16 at byte offset `o` of `row` (uint8), as float32."""
    return F16_TABLE[np.int64(row[o]) | (np.int64(row[o + 1]) << 8)]


# MXFP4's E8M0 scale byte e -> 2^(e - 128) (ggml's GGML_E8M0_TO_FP32_HALF: the half folds the
# doubled E2M1 levels back), exact in float32 for all 256 (2^-128, 2^-127 are subnormal)
E8M0_HALF = (2.0 ** (np.arange(256, dtype=np.float64) - 128)).astype(np.float32)


@njit(inline="always", cache=True)
def e8m0_at(row: np.ndarray, o: int) -> float:
    """The MXFP4 block scale whose E8M0 byte is row[o], as float32."""
    return E8M0_HALF[row[o]]


@njit(inline="always", cache=True)
def u32_at(row: np.ndarray, o: int) -> int:
    return (np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16)
            | (np.int64(row[o + 3]) << 24))


@njit(inline="always", cache=True)
def k4_scale_min(s: np.ndarray, o: int, j: int) -> tuple[int, int]:
    """6-bit (scale, min) of sub-block j from the 12 packed bytes at s[o:o+12] (Q4_K, Q5_K)."""
    if j < 4:
        return np.int64(s[o + j] & 63), np.int64(s[o + j + 4] & 63)
    sc = (s[o + j + 4] & 0xF) | ((s[o + j - 4] >> 6) << 4)
    mn = (s[o + j + 4] >> 4) | ((s[o + j] >> 6) << 4)
    return np.int64(sc), np.int64(mn)


@njit(inline="always", cache=True)
def k3_scale(s: np.ndarray, o: int, j: int) -> int:
    """Signed scale (-32..31) of sub-block j from Q3_K's 12 packed bytes at s[o:o+12]."""
    low = (s[o + (j & 7)] >> (4 * (j >> 3))) & 15
    high = (s[o + 8 + (j & 3)] >> (2 * (j >> 2))) & 3
    return np.int64(low | (high << 4)) - 32


def f16_bytes_as_f32(b: np.ndarray) -> np.ndarray:
    """[..., n, 2] little-endian f16 bytes -> [..., 4 n] bytes of the n values as float32 (the
    packed layouts' per-row scales, packed.py and packed_iquants.py)."""
    vals = np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)
    return np.ascontiguousarray(vals).view(np.uint8)
