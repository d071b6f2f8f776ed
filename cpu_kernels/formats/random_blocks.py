"""Random valid GGUF blocks for tests and benchmarks (numpy only).

Random bytes are valid blocks for every type once the float16 fields (d, dmin) are set to small
finite values (MXFP4: its E8M0 scale byte); F16/BF16 rows are random normal values. Scales are chosen so that dequantized
weights have magnitude ~0.01-0.1, like trained expert weights.
"""

from __future__ import annotations

import numpy as np

from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.weights import ExpertWeights, QuantMatrix

# qtype -> byte offsets of its f16 scale fields within a block, and the scale's magnitude
_F16_FIELDS: dict[int, tuple[tuple[int, ...], float]] = {
    qt.Q8_0: ((0,), 1e-3),
    qt.Q2_K: ((80,), 4e-3),
    qt.Q3_K: ((108,), 2e-3),
    qt.Q4_0: ((0,), 1e-2),
    qt.Q5_0: ((0,), 5e-3),
    qt.Q4_K: ((0, 2), 1e-3),
    qt.Q5_K: ((0, 2), 5e-4),
    qt.Q6_K: ((208,), 1e-3),
    # i-quants: d sized so grid * scale lands near 0.01-0.1 like the K-quants
    qt.IQ2_XXS: ((0,), 3e-4),
    qt.IQ2_XS: ((0,), 3e-4),
    qt.IQ2_S: ((0,), 3e-4),
    qt.IQ3_XXS: ((0,), 1e-4),
    qt.IQ3_S: ((0,), 2e-4),
    qt.IQ1_S: ((0,), 3e-3),
    qt.IQ4_NL: ((0,), 3e-4),
    qt.IQ4_XS: ((0,), 2e-5),
}


def _pack_k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K 12-byte packing of 6-bit scales and mins. sc, mn: [B, 8] -> [B, 12] uint8"""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _centre_k4(rng: np.random.Generator, raw: np.ndarray, levels: int) -> None:
    """Give Q4_K/Q5_K blocks mins that centre each sub-block near zero, like trained weights.

    Uniform random mins make every sub-block's mean a large random offset, a case no
    quantizer produces; with dmin = d * levels / 2 the centring min is m ~ sc * (levels-1)/levels.
    """
    num_blocks = raw.shape[0]
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(-1)
    raw[:, 2:4] = (d * levels / 2).astype(np.float16).view(np.uint8).reshape(num_blocks, 2)
    sc = rng.integers(16, 64, (num_blocks, 8)).astype(np.uint8)
    mn = np.clip(np.rint(sc.astype(np.float32) * (levels - 1) / levels), 0, 63).astype(np.uint8)
    raw[:, 4:16] = _pack_k4_scales(sc, mn)


def _centre_q2_k(rng: np.random.Generator, raw: np.ndarray) -> None:
    """Q2_K scales with min = scale and dmin = 1.5 d: each sub-block centred (codes average 1.5)."""
    num_blocks = raw.shape[0]
    d = raw[:, 80:82].copy().view(np.float16).astype(np.float32).reshape(-1)
    raw[:, 82:84] = (d * 1.5).astype(np.float16).view(np.uint8).reshape(num_blocks, 2)
    sc = rng.integers(4, 16, (num_blocks, 16)).astype(np.uint8)
    raw[:, 0:16] = sc | (sc << 4)


def _set_iq1_m_d(rng: np.random.Generator, raw: np.ndarray) -> None:
    """IQ1_M keeps its f16 d in the top nibbles of the 4 scale words at byte 48 (bits 4m..4m+3
    of d in the top nibble of word m)."""
    d = (rng.uniform(0.25, 1.0, raw.shape[0]) * 3e-3).astype(np.float16).view(np.uint16)
    for m in range(4):
        nib = ((d >> (4 * m)) & 15).astype(np.uint8)
        raw[:, 49 + 2 * m] = (raw[:, 49 + 2 * m] & 15) | (nib << 4)


def random_blocks(rng: np.random.Generator, qtype: int, shape: tuple[int, int, int]) -> np.ndarray:
    """Bytes [E, rows, row_bytes] uint8 of valid random blocks of `qtype` for `shape` (E, R, C)."""
    num_experts, rows, cols = shape
    nbytes = qt.row_nbytes(qtype, cols)
    if qtype in (qt.F16, qt.BF16):
        vals = (rng.standard_normal((num_experts, rows, cols)) * 0.05).astype(np.float32)
        if qtype == qt.F16:
            return vals.astype(np.float16).view(np.uint8)
        return (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block_size, type_size = qt.BLOCK_GEOMETRY[qtype]
    num_blocks = num_experts * rows * (cols // block_size)
    raw = rng.integers(0, 256, (num_blocks, type_size), dtype=np.uint8)
    if qtype == qt.IQ1_M:
        _set_iq1_m_d(rng, raw)
        return raw.reshape(num_experts, rows, nbytes)
    if qtype == qt.MXFP4:  # E8M0 scales 2^-11..2^-8: levels up to 12 give |w| <= 0.05
        raw[:, 0] = rng.integers(117, 121, num_blocks)
        return raw.reshape(num_experts, rows, nbytes)
    offsets, scale = _F16_FIELDS[qtype]
    for o in offsets:
        d = (rng.uniform(0.25, 1.0, num_blocks) * scale).astype(np.float16)
        raw[:, o:o + 2] = d.view(np.uint8).reshape(num_blocks, 2)
    if qtype in (qt.Q4_K, qt.Q5_K):
        _centre_k4(rng, raw, 16 if qtype == qt.Q4_K else 32)
    if qtype == qt.Q2_K:
        _centre_q2_k(rng, raw)
    return raw.reshape(num_experts, rows, nbytes)


def random_matrix(rng: np.random.Generator, qtype: int, shape: tuple[int, int, int]) -> QuantMatrix:
    return QuantMatrix(qtype, shape, random_blocks(rng, qtype, shape))


def random_experts(rng: np.random.Generator, num_experts: int, hidden: int, inter: int,
                   gate_type: int, up_type: int, down_type: int) -> ExpertWeights:
    """Random experts: gate/up [E, inter, hidden], down [E, hidden, inter]."""
    return ExpertWeights(
        gate=random_matrix(rng, gate_type, (num_experts, inter, hidden)),
        up=random_matrix(rng, up_type, (num_experts, inter, hidden)),
        down=random_matrix(rng, down_type, (num_experts, hidden, inter)),
    )
