"""The packed layouts of the i-quants, as numpy packers: the definition that pack_kernels.py's
parallel packers must equal byte for byte (see packed_tiles_grid.py for the field meanings).

Each takes raw GGUF blocks [G, 8 rows, B, type_size] and returns [G, B, packed_bytes]. Every
field is stored as [position][8 rows], so one 8-byte load gives a field of all 8 rows.
"""

from __future__ import annotations

import numpy as np

from cpu_kernels.formats.iquant_tables import SIGNS
from cpu_kernels.formats.scalars import f16_bytes_as_f32

# ksigns_iq2xs as bytes: bit j set where weight j of the run is negative (7 stored bits + parity)
SIGN_BYTES = (SIGNS < 0).astype(np.uint8).dot(1 << np.arange(8)).astype(np.uint8)


def _rows_last(v: np.ndarray) -> np.ndarray:
    """[G, B, 8 rows, n, ...] -> bytes [G, B, -1]: position-major, then the 8 rows, then the
    trailing axes (a run's two IQ3 codes) and the element's bytes."""
    moved = np.ascontiguousarray(np.moveaxis(v, 2, 3))
    return moved.view(np.uint8).reshape(*v.shape[:2], -1)


def pack_iq2_xxs(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 66] -> [G, B, 576]
    a = raw.transpose(0, 2, 1, 3)  # [G, B, 8 rows, 66]
    g, b = a.shape[:2]
    sub = a[..., 2:].reshape(g, b, 8, 8, 8)  # [row, sub-block, 4 codes + u32]
    codes = sub[..., :4].reshape(g, b, 8, 32)
    signs, scales = _signs_scales(np.ascontiguousarray(sub[..., 4:]).view(np.uint32)[..., 0])
    return np.concatenate([_rows_last(codes), signs, scales, f16_bytes_as_f32(a[..., 0:2])], -1)


def _signs_scales(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """u32 words [G, B, 8 rows, 8 sub-blocks] (4 7-bit sign indices, a 4-bit scale on top) ->
    sign bytes [32 runs][8 rows] and scale nibbles [4 pairs][8 rows] (even sub-block low)."""
    g, b = w.shape[:2]
    sign7 = (w[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    nib = (w >> 28).astype(np.uint8)
    return (_rows_last(SIGN_BYTES[sign7.reshape(g, b, 8, 32)]),
            _rows_last(nib[..., 0::2] | (nib[..., 1::2] << 4)))


def pack_iq2_xs(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 74] -> [G, B, 608]: u16 (code | sign7 << 9) [32][8]; scales [8][8]; d
    a = raw.transpose(0, 2, 1, 3)
    qs = np.ascontiguousarray(a[..., 2:66]).view(np.uint16)  # [G, B, row, 32]
    return np.concatenate([_rows_last(qs), _rows_last(a[..., 66:74]), f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_iq2_s(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 82] -> [G, B, 672]: low codes [32][8]; signs [32][8]; high code bits
    # [8][8] (2 per run); scales [8][8]; d
    a = raw.transpose(0, 2, 1, 3)
    return np.concatenate([_rows_last(a[..., 2:34]), _rows_last(a[..., 34:66]),
                           _rows_last(a[..., 66:74]), _rows_last(a[..., 74:82]),
                           f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_iq3_xxs(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 98] -> [G, B, 832]: codes [32 runs][8 rows][2]; signs [32][8]; scale
    # nibbles [4][8]; d
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    codes = a[..., 2:66].reshape(g, b, 8, 32, 2)
    signs, scales = _signs_scales(np.ascontiguousarray(a[..., 66:98]).view(np.uint32))
    return np.concatenate([_rows_last(codes), signs, scales, f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_iq3_s(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 110] -> [G, B, 896]: low codes [32][8][2]; high bits [8][8] (bit m:
    # code m of the sub-block); signs [32][8]; scale nibbles [4][8]; d
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    return np.concatenate([_rows_last(a[..., 2:66].reshape(g, b, 8, 32, 2)),
                           _rows_last(a[..., 66:74]), _rows_last(a[..., 74:106]),
                           _rows_last(a[..., 106:110]), f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_iq1_s(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 50] -> [G, B, 416]
    a = raw.transpose(0, 2, 1, 3)
    low = a[..., 2:34]  # [G, B, row, 32 runs]
    qh = np.ascontiguousarray(a[..., 34:50]).view(np.uint16)  # [G, B, row, 8 sub-blocks]
    return np.concatenate([_rows_last(low), _rows_last(qh), f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_iq1_m(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 56] -> [G, B, 480]: low codes [32][8]; high nibbles [16 pairs][8];
    # 3-bit scales [8 sub][8] (first 16 columns low); d (from the scale words' top nibbles)
    a = raw.transpose(0, 2, 1, 3)
    words = np.ascontiguousarray(a[..., 48:56]).view(np.uint16).astype(np.uint32)  # [.., 4]
    sc = (words[..., :, None] >> (3 * np.arange(4, dtype=np.uint32))) & 7  # [.., 4, 4]
    sc = sc.reshape(*sc.shape[:-2], 16).astype(np.uint8)
    bits = sum((words[..., m] >> 12) << (4 * m) for m in range(4)).astype(np.uint16)
    d = np.ascontiguousarray(bits.view(np.float16).astype(np.float32)).view(np.uint8)
    return np.concatenate([_rows_last(a[..., 0:32]), _rows_last(a[..., 32:48]),
                           _rows_last(sc[..., 0::2] | (sc[..., 1::2] << 4)), d.reshape(
                               *a.shape[:2], 32)], -1)


def pack_iq4_xs(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 136] -> [G, B, 1120]: per sub-block 4 steps of [8 rows][4 bytes];
    # int8 scales - 32 [8 sub][8 rows]; d
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    steps = a[..., 8:136].reshape(g, b, 8, 8, 4, 4).transpose(0, 1, 3, 4, 2, 5)
    high = np.ascontiguousarray(a[..., 2:4]).view(np.uint16)[..., 0].astype(np.int16)  # [.., row]
    sub = np.arange(8)
    low = (a[..., 4 + (sub >> 1)] >> (4 * (sub & 1))) & 15  # [G, B, row, sub]
    scales = (low.astype(np.int16) | (((high[..., None] >> (2 * sub)) & 3) << 4)) - 32
    return np.concatenate([steps.reshape(g, b, 1024), _rows_last(scales.astype(np.int8)),
                           f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_iq4_nl(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 18] -> [G, B, 160]: 4 steps of [8 rows][4 bytes]; d
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    steps = a[..., 2:18].reshape(g, b, 8, 4, 4).transpose(0, 1, 3, 2, 4)
    return np.concatenate([steps.reshape(g, b, 128), f16_bytes_as_f32(a[..., 0:2])], -1)


def pack_mxfp4(raw: np.ndarray) -> np.ndarray:
    # raw: [G, 8 rows, B, 17] -> [G, B, 136]: 4 steps of [8 rows][4 bytes]; k = max(e - 1, 0) [8]
    a = raw.transpose(0, 2, 1, 3)
    g, b = a.shape[:2]
    steps = a[..., 1:17].reshape(g, b, 8, 4, 4).transpose(0, 1, 3, 2, 4)
    k = np.maximum(a[..., 0].astype(np.int16) - 1, 0).astype(np.uint8)  # [G, B, 8 rows]
    return np.concatenate([steps.reshape(g, b, 128), k], -1)
