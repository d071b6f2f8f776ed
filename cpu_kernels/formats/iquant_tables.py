"""The i-quants' lattice grids and sign patterns as int8 arrays, decoded once at import.

The data (ggml's iq*_grid tables, as gguf-py holds them) is in iquant_grid_data.py, generated
by scripts/gen_iquant_tables.py: each grid row is one code's 8 (or 4) values, packed as indices
into a value map, 2 bits each for 3 or 4 values, one per nibble (its low 3 bits) for 8, low
bits first.
"""

from __future__ import annotations

import numpy as np

from cpu_kernels.formats.iquant_grid_data import HEX, VALUES
from cpu_kernels.formats.iquant_grid_data import IQ4_LEVELS as _LEVELS


def _decode(name: str, shape: tuple[int, int]) -> np.ndarray:
    """The packed hex grid `name` as int8 [codes, width]."""
    raw = np.frombuffer(bytes.fromhex(HEX[name]), np.uint8)
    values = VALUES[name]
    bits = 2 if len(values) <= 4 else 3
    step = 2 if bits == 2 else 4  # indices of 3 bits sit one per nibble
    shifts = np.arange(0, 8, step, dtype=np.uint8)
    idx = (raw[:, None] >> shifts) & ((1 << bits) - 1)
    return np.asarray(values, np.int8)[idx.reshape(-1)].reshape(shape)


def _signs() -> np.ndarray:
    """ggml's ksigns_iq2xs as +-1: [128, 8] int8. Index i holds 7 sign bits; the 8th makes the
    count of minus signs even."""
    i = np.arange(128)
    parity = np.array([int(v).bit_count() & 1 for v in i])
    byte = (i | (parity << 7)).astype(np.uint8)
    bits = (byte[:, None] >> np.arange(8, dtype=np.uint8)) & 1
    return (1 - 2 * bits.astype(np.int8)).astype(np.int8)


GRID_IQ2_XXS = _decode("IQ2_XXS", (256, 8))
GRID_IQ2_XS = _decode("IQ2_XS", (512, 8))
GRID_IQ2_S = _decode("IQ2_S", (1024, 8))
GRID_IQ3_XXS = _decode("IQ3_XXS", (256, 4))
GRID_IQ3_S = _decode("IQ3_S", (512, 4))
GRID_IQ1_S = _decode("IQ1_S", (2048, 8))  # values -1, 0, 1
SIGNS = _signs()
# IQ4_NL / IQ4_XS: the 16 non-uniform levels a 4-bit code selects
IQ4_LEVELS = np.array(_LEVELS, np.int8)
# MXFP4: the E2M1 values a 4-bit code selects, doubled to integers (ggml's kvalues_mxfp4)
MXFP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
