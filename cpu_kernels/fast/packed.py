"""Load-time repacking of GGUF blocks into row-interleaved tiles for the `fast` kernels.

Each group of 8 consecutive rows is stored together: a 32-byte vector holds 4 consecutive codes
(k..k+3) of each of the 8 rows, byte 4r + j = code of row r at k + j, so one vpdpbusd against 4
broadcast activations gives 8 row sums in 8 lanes (no horizontal sums), and per-row scales are
vectors. The tiles (packed_tiles.py) join the same vectors of two groups into one 512-bit
register: 16 rows per instruction. Codes are stored unsigned (Q8_0's int8 flipped by 0x80); offsets are removed with the
activation sums. Nothing is dequantized: per 8 rows and block the packed bytes are

    Q4_K (1216 B / 256 cols): 1024 nibbles (chunk c, step k4: low nibbles sub-block 2c, high
        2c+1), u8 scales [8 sub][8 rows], u8 mins [8][8], f32 d [8], f32 dmin [8]      1.056x
    Q6_K (1696 B / 256): per 16-col sub-block p: nibbles of steps 0|1, of 2|3, 2-bit highs of
        steps 0..3 (96 B); int8 scales [16][8]; f32 d [8]                               1.010x
    Q8_0 (288 B / 32): 8 steps x 32 B of code + 128; f32 d [8]                          1.059x
    Q5_0 (192 B / 32): nibbles of steps 0|1, 2|3, 4|5, 6|7; bit 4 of step i's codes in bit i
        (32 B); f32 d [8]                                                               1.091x
    Q2_K (704 B / 256): per 16-col sub-block p, the 2-bit codes of steps 0..3 in bits 2i (32 B);
        u8 scale | min << 4 [16 sub][8 rows]; f32 d [8], f32 dmin [8]                    1.048x
    Q3_K (928 B / 256): 2-bit low codes as Q2_K (512 B); per pair of sub-blocks, bit 2 of step
        i's codes in bit i (even p) or 4 + i (odd p) (32 B); int8 scale - 32 [16][8]; f32 d [8]
        (codes c = low | hbit << 2 in 0..7, weight (c - 4) * d * scale)                 1.055x

The i-quants' layouts (packed_iquants.py; tiles in packed_tiles_grid.py and packed_tiles_iq4.py)
keep their codes whole: IQ4_XS 1.029x, IQ4_NL 1.111x, the lattice types 1.018-1.091x; MXFP4
(packed_tiles_iq4.py) 1.000x.

Rows are padded to a multiple of 8 with zero blocks (d = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cpu_kernels.fast import packed_iquants as iq
from cpu_kernels.fast.grid_blocks import BLOCK_BYTES as GRID_BLOCK_BYTES
from cpu_kernels.fast.packed_tiles_iq4 import IQ4_NL_BYTES, IQ4_XS_BYTES, MXFP4_BYTES
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.scalars import f16_bytes_as_f32
from cpu_kernels.formats.weights import ExpertWeights, QuantMatrix, read_only

ROWS = 8
# qtype -> (columns per packed block, packed bytes per 8 rows x block)
PACKED_GEOMETRY: dict[int, tuple[int, int]] = {
    qt.Q4_K: (256, 1216),
    qt.Q6_K: (256, 1696),
    qt.Q8_0: (32, 288),
    qt.Q5_0: (32, 192),
    qt.Q2_K: (256, 704),
    qt.Q3_K: (256, 928),
    **{qtype: (256, size) for qtype, size in GRID_BLOCK_BYTES.items()},
    qt.IQ4_XS: (256, IQ4_XS_BYTES),
    qt.IQ4_NL: (32, IQ4_NL_BYTES),
    qt.MXFP4: (32, MXFP4_BYTES),
}


@dataclass(frozen=True)
class PackedMatrix:
    """A QuantMatrix stack repacked for the row-interleaved kernels.

    `data`: [E, ceil(rows / 8), row_group_bytes] uint8; `shape` is the logical (E, rows, cols).
    """

    qtype: int
    shape: tuple[int, int, int]
    data: np.ndarray  # [E, RG, row_group_bytes] uint8, read-only (weights.read_only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", read_only(self.data))

    @classmethod
    def of(cls, w: QuantMatrix, rows: tuple[int, int] | None = None,
           cols: tuple[int, int] | None = None) -> PackedMatrix:
        """Pack W[:, rows[0]:rows[1], cols[0]:cols[1]] (default: all); cols on block bounds.

        Written by numba's threads (pack_kernels.py), every (expert, 8 rows) a task; called on
        a pool group's pinned thread, those threads inherit its pin, so the copy's pages are
        first touched, so placed, on that group's NUMA node.
        """
        from cpu_kernels.fast.pack_kernels import pack_blocks

        r_lo, r_hi, c_lo, c_hi, data = _destination(w, rows, cols)
        pack_blocks(w.qtype, w.blocks, r_lo, r_hi - r_lo, qt.row_nbytes(w.qtype, c_lo),
                    qt.BLOCK_GEOMETRY[w.qtype][1], PACKED_GEOMETRY[w.qtype][1], data)
        return cls(w.qtype, (w.num_experts, r_hi - r_lo, c_hi - c_lo), data)

    @classmethod
    def reference(cls, w: QuantMatrix, rows: tuple[int, int] | None = None,
                  cols: tuple[int, int] | None = None) -> PackedMatrix:
        """The same bytes by the numpy packers below, one expert at a time (the layouts'
        definition; pack_kernels.py must equal it)."""
        r_lo, r_hi, c_lo, c_hi, data = _destination(w, rows, cols)
        b_lo, b_hi = qt.row_nbytes(w.qtype, c_lo), qt.row_nbytes(w.qtype, c_hi)
        num_rows, groups = r_hi - r_lo, data.shape[1]
        block_cols = PACKED_GEOMETRY[w.qtype][0]
        pack = _PACKERS[w.qtype]
        for e in range(w.num_experts):  # one expert at a time bounds the temporaries
            raw = np.zeros((groups * ROWS, b_hi - b_lo), np.uint8)
            raw[:num_rows] = w.blocks[e, r_lo:r_hi, b_lo:b_hi]
            data[e] = pack(raw.reshape(groups, ROWS, (c_hi - c_lo) // block_cols, -1)).reshape(
                groups, -1)
        return cls(w.qtype, (w.num_experts, num_rows, c_hi - c_lo), data)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def packed_shape(qtype: int, num_experts: int, rows: int, cols: int) -> tuple[int, int, int]:
    """The shape of PackedMatrix.data for `num_experts` x `rows` x `cols` of `qtype`."""
    if qtype not in PACKED_GEOMETRY:
        raise ValueError(f"no packed layout for {qt.type_name(qtype)}")
    block_cols, block_bytes = PACKED_GEOMETRY[qtype]
    return num_experts, -(-rows // ROWS), cols // block_cols * block_bytes


def packed_ratio(qtype: int) -> float:
    """Packed bytes per GGUF byte of `qtype` (whole groups of 8 rows)."""
    block_cols, block_bytes = PACKED_GEOMETRY[qtype]
    block, size = qt.BLOCK_GEOMETRY[qtype]
    return block_bytes / (ROWS * size * (block_cols // block))


def _destination(w: QuantMatrix, rows: tuple[int, int] | None, cols: tuple[int, int] | None
                 ) -> tuple[int, int, int, int, np.ndarray]:
    r_lo, r_hi = rows or (0, w.rows)
    c_lo, c_hi = cols or (0, w.cols)
    shape = packed_shape(w.qtype, w.num_experts, r_hi - r_lo, c_hi - c_lo)
    return r_lo, r_hi, c_lo, c_hi, np.empty(shape, np.uint8)


@dataclass(frozen=True)
class PackedExperts:
    """gate/up `[E, I/8, ...]` and down `[E, H/8, ...]` of one layer, packed."""

    gate: PackedMatrix
    up: PackedMatrix
    down: PackedMatrix

    @classmethod
    def of(cls, experts: ExpertWeights, i_lo: int = 0, i_hi: int | None = None) -> PackedExperts:
        """Pack the experts' intermediate rows i_lo:i_hi (gate/up rows, down columns)."""
        rows = (i_lo, experts.intermediate_size if i_hi is None else i_hi)
        return cls(PackedMatrix.of(experts.gate, rows=rows), PackedMatrix.of(experts.up, rows=rows),
                   PackedMatrix.of(experts.down, cols=rows))


def can_pack(qtype: int) -> bool:
    return qtype in PACKED_GEOMETRY


def _steps(codes: np.ndarray) -> np.ndarray:
    """codes [G, B, 8 rows, n] -> [G, B, n/4 steps, 32]: byte 4r + j of step s = row r, col 4s+j."""
    g, b, r, n = codes.shape
    return codes.reshape(g, b, r, n // 4, 4).transpose(0, 1, 3, 2, 4).reshape(g, b, n // 4, 32)


def _pack_q4_k(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 144] -> [G, B, 1216]
    a = raw.transpose(0, 2, 1, 3)  # [G, B, 8 rows, 144]
    g, b = a.shape[:2]
    qs = a[..., 16:].reshape(g, b, ROWS, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5).reshape(g, b, 1024)
    s = a[..., 4:16].astype(np.uint8)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    sc = sc.transpose(0, 1, 3, 2).reshape(g, b, 64)  # [sub][row]
    mn = mn.transpose(0, 1, 3, 2).reshape(g, b, 64)
    return np.concatenate([qs, sc, mn, f16_bytes_as_f32(a[..., 0:2]),
                           f16_bytes_as_f32(a[..., 2:4])], -1)


def _q6_k_codes(a: np.ndarray) -> np.ndarray:
    """Q6_K blocks [..., 210] -> unsigned 6-bit codes [..., 256]."""
    ql, qh = a[..., 0:128].astype(np.uint8), a[..., 128:192].astype(np.uint8)
    halves = []
    for n in range(2):
        lo, hi, h = ql[..., 64 * n:64 * n + 32], ql[..., 64 * n + 32:64 * n + 64], qh[
            ..., 32 * n:32 * n + 32]
        halves += [(lo & 15) | ((h & 3) << 4), (hi & 15) | (((h >> 2) & 3) << 4),
                   (lo >> 4) | (((h >> 4) & 3) << 4), (hi >> 4) | (((h >> 6) & 3) << 4)]
    return np.concatenate(halves, -1)


def _pack_q6_k(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 210] -> [G, B, 1696]
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    v = _steps(_q6_k_codes(a)).reshape(g, b, 16, 4, 32)  # [sub p][step i][32]
    n01 = (v[:, :, :, 0] & 15) | ((v[:, :, :, 1] & 15) << 4)
    n23 = (v[:, :, :, 2] & 15) | ((v[:, :, :, 3] & 15) << 4)
    hb = (v[:, :, :, 0] >> 4) | ((v[:, :, :, 1] >> 4) << 2) | ((v[:, :, :, 2] >> 4) << 4) | (
        (v[:, :, :, 3] >> 4) << 6)
    quads = np.stack([n01, n23, hb], 3).reshape(g, b, 1536)
    scales = a[..., 192:208].transpose(0, 1, 3, 2).reshape(g, b, 128)
    return np.concatenate([quads, scales, f16_bytes_as_f32(a[..., 208:210])], -1)


def _pack_q8_0(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 34] -> [G, B, 288]
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    codes = _steps(a[..., 2:] ^ np.uint8(0x80)).reshape(g, b, 256)
    return np.concatenate([codes, f16_bytes_as_f32(a[..., 0:2])], -1)


def _pack_q5_0(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 22] -> [G, B, 192]
    a = raw.transpose(0, 2, 1, 3)
    qh = a[..., 2:6].copy().view(np.uint32)  # [G, B, 8, 1]
    bits = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [G, B, 8, 32]
    qs = a[..., 6:22]
    codes = np.concatenate([qs & 15, qs >> 4], -1) | (bits << 4)
    v = _steps(codes)  # [G, B, 8 steps, 32]
    nib = [(v[:, :, 2 * m] & 15) | ((v[:, :, 2 * m + 1] & 15) << 4) for m in range(4)]
    hb = sum(((v[:, :, i] >> 4) & 1) << i for i in range(8)).astype(np.uint8)
    return np.concatenate([*nib, hb, f16_bytes_as_f32(a[..., 0:2])], -1)


def _low_codes(qs: np.ndarray) -> np.ndarray:
    """Q2_K/Q3_K qs [..., 64] -> 2-bit codes [..., 256]: element 128 n + 32 j + l at bit 2j of
    qs[32 n + l]."""
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return ((qs.reshape(*qs.shape[:-1], 2, 1, 32) >> shifts) & 3).reshape(*qs.shape[:-1], 256)


def _two_bit_steps(codes: np.ndarray) -> np.ndarray:
    """codes [G, B, 8 rows, 256] (< 4) -> [G, B, 16 sub, 32]: step i of sub-block p in bits 2i."""
    v = _steps(codes).reshape(*codes.shape[:2], 16, 4, 32)
    return v[:, :, :, 0] | (v[:, :, :, 1] << 2) | (v[:, :, :, 2] << 4) | (v[:, :, :, 3] << 6)


def _pack_q2_k(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 84] -> [G, B, 704]
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    codes = _two_bit_steps(_low_codes(a[..., 16:80])).reshape(g, b, 512)
    scales = a[..., 0:16].transpose(0, 1, 3, 2).reshape(g, b, 128)
    return np.concatenate([codes, scales, f16_bytes_as_f32(a[..., 80:82]),
                           f16_bytes_as_f32(a[..., 82:84])], -1)


def _pack_q3_k(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 110] -> [G, B, 928]
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    low = _two_bit_steps(_low_codes(a[..., 32:96])).reshape(g, b, 512)
    # hmask: element 32 i + l has its bit at bit i of byte l
    bits = np.arange(8, dtype=np.uint8).reshape(8, 1)
    hbit = (a[..., 0:32].reshape(g, b, ROWS, 1, 32) >> bits) & 1
    v = _steps(hbit.reshape(g, b, ROWS, 256)).reshape(g, b, 8, 2, 4, 32)  # [pair][odd][step]
    nib = v[..., 0, :] | (v[..., 1, :] << 1) | (v[..., 2, :] << 2) | (v[..., 3, :] << 3)
    high = (nib[:, :, :, 0] | (nib[:, :, :, 1] << 4)).reshape(g, b, 256)
    s = a[..., 96:108]
    lo = np.concatenate([s[..., 0:8] & 15, s[..., 0:8] >> 4], -1)
    hi = np.concatenate([(s[..., 8:12] >> (2 * k)) & 3 for k in range(4)], -1)
    sc = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    scales = sc.transpose(0, 1, 3, 2).reshape(g, b, 128)
    return np.concatenate([low, high, scales, f16_bytes_as_f32(a[..., 108:110])], -1)


_PACKERS = {qt.Q4_K: _pack_q4_k, qt.Q6_K: _pack_q6_k, qt.Q8_0: _pack_q8_0, qt.Q5_0: _pack_q5_0,
            qt.Q2_K: _pack_q2_k, qt.Q3_K: _pack_q3_k, qt.IQ2_XXS: iq.pack_iq2_xxs,
            qt.IQ2_XS: iq.pack_iq2_xs, qt.IQ2_S: iq.pack_iq2_s, qt.IQ3_XXS: iq.pack_iq3_xxs,
            qt.IQ3_S: iq.pack_iq3_s, qt.IQ1_S: iq.pack_iq1_s, qt.IQ1_M: iq.pack_iq1_m,
            qt.IQ4_XS: iq.pack_iq4_xs, qt.IQ4_NL: iq.pack_iq4_nl, qt.MXFP4: iq.pack_mxfp4}


def pack(experts: ExpertWeights) -> ExpertWeights:
    """Make the packed copy `fast` mode runs on, once (in place), and return `experts`.

    It reads every expert (~0.1-0.25 s per V3 expert in numpy): call it at load time. The copy
    holds 1.01-1.09x the GGUF bytes; the GGUF blocks stay for `exact` mode. Nothing is made when
    some matrix's type has no packed layout (`can_pack`).
    """
    if experts.packed is None and all(can_pack(w.qtype)
                                      for w in (experts.gate, experts.up, experts.down)):
        # NOTE: a cache of derived bytes on a frozen record; the record's value is unchanged
        object.__setattr__(experts, "packed", PackedExperts.of(experts))
    return experts
