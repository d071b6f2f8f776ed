"""Random, valid GGML blocks with a chosen weight spread, written straight in the block format:
the one generator of the project's synthetic weights (make-model's files, the kernels' tests
and benchmarks).

A synthetic model needs weights, not a faithful quantization of some other weights: the GGUF
defines the model, and every reader (ours, gguf-py, llama.cpp) must agree on what these blocks
mean. Writing random quant codes directly is also ~100x faster than quantizing Gaussians, which
is what makes a 10 GB V2-Lite file take minutes.

    random_rows(rng, qtype, rows, cols, std)   [rows, row_bytes] uint8 (F32/F16/BF16: values)
    random_blocks(rng, qtype, (E, R, C))       [E, R, row_bytes] uint8, std DEFAULT_STD
    random_matrix / random_experts             the same as QuantMatrix / ExpertWeights

Dequantized values have mean ~0 and standard deviation ~`std`; every block scale varies by
+-25% and the K-quants' mins centre their sub-blocks, as trained weights' quantizations do.
"""

from __future__ import annotations

import numpy as np

import ggml_types as gt
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.weights import ExpertWeights, QuantMatrix

# the spread of random_blocks' weights: a trained expert's (~0.01-0.1)
DEFAULT_STD = 0.05

# the standard deviation of random i-quant blocks' weights at d = 1 (their grids and scale codes
# have no closed form worth writing): measured on 4096 random blocks a type, checked against
# gguf-py's dequantization by tests/cpu_kernels/test_random_blocks.py
IQUANT_UNIT_STD = {gt.IQ1_S: 7.193493366241455, gt.IQ1_M: 7.235467910766602,
                   gt.IQ2_XXS: 53.185672760009766, gt.IQ2_XS: 55.911983489990234,
                   gt.IQ2_S: 56.475074768066406, gt.IQ3_XXS: 142.39768981933594,
                   gt.IQ3_S: 140.193603515625, gt.IQ4_NL: 67.10863494873047,
                   gt.IQ4_XS: 1248.051513671875}


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """[..., 1] fp16 values -> [..., 2] bytes."""
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], 2)


def _scale(rng: np.random.Generator, shape: tuple[int, ...], base: float) -> np.ndarray:
    # Per-block scales vary by +-25% so blocks are not all alike.
    return (base * rng.uniform(0.75, 1.25, size=(*shape, 1))).astype(np.float32)


def random_rows(rng: np.random.Generator, qtype: int, rows: int, cols: int, std: float
                ) -> np.ndarray:
    """Rows of random weights in `qtype`: float arrays for F32/F16/BF16, else block bytes."""
    if qtype == gt.F32:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float32)
    if qtype == gt.F16:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)
    if qtype == gt.BF16:
        w = rng.standard_normal((rows, cols), dtype=np.float32) * std
        return (w.view(np.uint32) >> 16).astype(np.uint16)  # truncation is a valid bf16 value
    if qtype not in _GENERATORS:
        raise ValueError(f"no random blocks of {gt.NAMES.get(qtype, f'type {qtype}')}")
    block_size, type_size = gt.GEOMETRY[qtype]
    nb = cols // block_size
    gen = _GENERATORS[qtype]
    blocks = gen(rng, (rows, nb), std)
    assert blocks.shape == (rows, nb, type_size)
    return blocks.reshape(rows, nb * type_size)


def _q8_0(rng, shape, std):
    q = rng.integers(-127, 128, size=(*shape, 32), dtype=np.int8)
    d = _scale(rng, shape, std / 73.6)  # std of uniform int8 in [-127, 127] ~ 73.6
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=-1)


def _q4_0(rng, shape, std):
    qs = rng.integers(0, 256, size=(*shape, 16), dtype=np.uint8)
    return np.concatenate([_f16_bytes(_scale(rng, shape, std / 4.61)), qs], axis=-1)


def _q4_1(rng, shape, std):
    qs = rng.integers(0, 256, size=(*shape, 16), dtype=np.uint8)
    d = _scale(rng, shape, std / 4.61)
    return np.concatenate([_f16_bytes(d), _f16_bytes(-7.5 * d), qs], axis=-1)


def _q5_0(rng, shape, std):
    rest = rng.integers(0, 256, size=(*shape, 20), dtype=np.uint8)  # qh (4) + qs (16)
    return np.concatenate([_f16_bytes(_scale(rng, shape, std / 9.23)), rest], axis=-1)


def _q5_1(rng, shape, std):
    rest = rng.integers(0, 256, size=(*shape, 20), dtype=np.uint8)
    d = _scale(rng, shape, std / 9.23)
    return np.concatenate([_f16_bytes(d), _f16_bytes(-15.5 * d), rest], axis=-1)


def _k_scales_mins(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Pack 8 six-bit scales and mins ([..., 8] each) into Q4_K/Q5_K's 12 bytes."""
    out = np.empty((*sc.shape[:-1], 12), dtype=np.uint8)
    out[..., 0:4] = (sc[..., 0:4] & 63) | ((sc[..., 4:8] >> 4) << 6)
    out[..., 4:8] = (mn[..., 0:4] & 63) | ((mn[..., 4:8] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:8] & 0x0F) | ((mn[..., 4:8] & 0x0F) << 4)
    return out


def _k_quant(rng, shape, std, q_std, q_mid, payload_bytes):
    # w = d*sc*q - dmin*m with m = sc and dmin = q_mid*d: centred, spread d*sc*q_std.
    sc = rng.integers(32, 64, size=(*shape, 8), dtype=np.uint8)
    d = _scale(rng, shape, std / (47.5 * q_std))
    dmin = (d.astype(np.float16).astype(np.float32) * q_mid)
    payload = rng.integers(0, 256, size=(*shape, payload_bytes), dtype=np.uint8)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _k_scales_mins(sc, sc), payload], axis=-1)


def _q4_k(rng, shape, std):
    return _k_quant(rng, shape, std, 4.61, 7.5, 128)


def _q5_k(rng, shape, std):
    return _k_quant(rng, shape, std, 9.23, 15.5, 32 + 128)


def _q6_k(rng, shape, std):
    q = rng.integers(0, 256, size=(*shape, 192), dtype=np.uint8)  # ql (128) + qh (64)
    sc = rng.integers(48, 128, size=(*shape, 16), dtype=np.int8)
    d = _scale(rng, shape, std / (88.0 * 18.5))
    return np.concatenate([q, sc.view(np.uint8), _f16_bytes(d)], axis=-1)


def _q2_k(rng, shape, std):
    sc = rng.integers(8, 16, size=(*shape, 16), dtype=np.uint8)
    scales = sc | (sc << 4)  # min = scale, dmin = 1.5 d: centred
    qs = rng.integers(0, 256, size=(*shape, 64), dtype=np.uint8)
    d = _scale(rng, shape, std / (11.5 * 1.118))
    dmin = d.astype(np.float16).astype(np.float32) * 1.5
    return np.concatenate([scales, qs, _f16_bytes(d), _f16_bytes(dmin)], axis=-1)


def _q3_k(rng, shape, std):
    hq = rng.integers(0, 256, size=(*shape, 96), dtype=np.uint8)  # hmask (32) + qs (64)
    # Scales are stored +32; keep them in 40..63 (positive 8..31).
    s = rng.integers(40, 64, size=(*shape, 16), dtype=np.uint8)
    low, high = s & 0x0F, s >> 4
    packed = np.empty((*shape, 12), dtype=np.uint8)
    packed[..., 0:8] = low[..., 0:8] | (low[..., 8:16] << 4)
    i = np.arange(4)
    packed[..., 8:12] = (high[..., i] | (high[..., 4 + i] << 2) | (high[..., 8 + i] << 4)
                         | (high[..., 12 + i] << 6))
    d = _scale(rng, shape, std / (19.5 * 2.29))
    return np.concatenate([hq, packed, _f16_bytes(d)], axis=-1)


def _put_d(qtype: int, raw: np.ndarray, d: np.ndarray) -> None:
    """Write the block scale d ([..., 1] float) into i-quant blocks [..., type_size]: f16 at byte
    0, except IQ1_M, which spreads it over the top nibbles of its scale words at 48..55."""
    if qtype != gt.IQ1_M:
        raw[..., 0:2] = _f16_bytes(d)
        return
    bits = d.astype(np.float16).view(np.uint16)[..., 0]
    for m in range(4):
        raw[..., 49 + 2 * m] = (raw[..., 49 + 2 * m] & 15) | (((bits >> (4 * m)) & 15) << 4).astype(
            np.uint8)


def _iquant(qtype: int):
    def gen(rng, shape, std):
        _, type_size = gt.GEOMETRY[qtype]
        raw = rng.integers(0, 256, size=(*shape, type_size), dtype=np.uint8)
        # a random sign per block centres the IQ4 levels, whose mean is -5.9 (not 0)
        sign = rng.choice(np.array([-1.0, 1.0], np.float32), size=(*shape, 1))
        _put_d(qtype, raw, sign * _scale(rng, shape, std / IQUANT_UNIT_STD[qtype]))
        return raw
    return gen


def _mxfp4(rng, shape, std):
    # random codes: levels (E2M1 doubled) of mean 0 and std sqrt(34.25) = 5.85; E8M0 scales
    # 2^(e - 128) of e0 - 1 or e0, whose mean square is 0.625 2^(2 (e0 - 128))
    qs = rng.integers(0, 256, size=(*shape, 16), dtype=np.uint8)
    e0 = 128 + round(float(np.log2(std / (5.85 * 0.625 ** 0.5))))
    e = np.clip(e0 + rng.integers(-1, 1, size=(*shape, 1)), 1, 254).astype(np.uint8)
    return np.concatenate([e, qs], axis=-1)


_GENERATORS = {
    gt.Q8_0: _q8_0, gt.Q4_0: _q4_0, gt.Q4_1: _q4_1, gt.Q5_0: _q5_0, gt.Q5_1: _q5_1,
    gt.Q2_K: _q2_k, gt.Q3_K: _q3_k, gt.Q4_K: _q4_k, gt.Q5_K: _q5_k, gt.Q6_K: _q6_k,
    gt.MXFP4: _mxfp4, **{t: _iquant(t) for t in IQUANT_UNIT_STD},
}


def random_blocks(rng: np.random.Generator, qtype: int, shape: tuple[int, int, int],
                  std: float = DEFAULT_STD) -> np.ndarray:
    """Bytes [E, rows, row_bytes] uint8 of valid random blocks of `qtype` for `shape` (E, R, C):
    a type the CPU kernels compute on (F16 and BF16 as their bytes)."""
    num_experts, rows, cols = shape
    nbytes = qt.row_nbytes(qtype, cols)  # raises for a type or width the kernels lack
    out = random_rows(rng, qtype, num_experts * rows, cols, std)
    return np.ascontiguousarray(out).view(np.uint8).reshape(num_experts, rows, nbytes)


def random_matrix(rng: np.random.Generator, qtype: int, shape: tuple[int, int, int],
                  std: float = DEFAULT_STD) -> QuantMatrix:
    return QuantMatrix(qtype, shape, random_blocks(rng, qtype, shape, std))


def random_experts(rng: np.random.Generator, num_experts: int, hidden: int, inter: int,
                   gate_type: int, up_type: int, down_type: int) -> ExpertWeights:
    """Random experts: gate/up [E, inter, hidden], down [E, hidden, inter]."""
    return ExpertWeights(
        gate=random_matrix(rng, gate_type, (num_experts, inter, hidden)),
        up=random_matrix(rng, up_type, (num_experts, inter, hidden)),
        down=random_matrix(rng, down_type, (num_experts, hidden, inter)),
    )
