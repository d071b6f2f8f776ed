"""Write cpu_kernels/iquant_tables.py: the i-quants' lattice grids, taken from gguf-py.

    python scripts/gen_iquant_tables.py

cpu_kernels imports nothing but numpy and numba at run time, so the grids (ggml's iq2xxs_grid,
iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid) are written into that module as the
packed hex strings gguf-py holds (each element an index into a short value map, 2 or 3 bits).
tests/cpu_kernels/test_iquant_tables.py checks the decoded grids against gguf-py's.
"""

from __future__ import annotations

import textwrap
from importlib.metadata import version
from pathlib import Path

from gguf import quants

GRIDS = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S")
OUT = Path(__file__).resolve().parent.parent / "cpu_kernels" / "iquant_tables.py"

HEAD = '''"""The i-quants' lattice grids and value tables (generated: scripts/gen_iquant_tables.py).

Taken from gguf-py {version} (ggml's iq*_grid tables): each grid row is one code's 8 (or 4)
values, packed in the hex strings as indices into the value map (2 bits each for 3 or 4
values, one per nibble for 8; low bits first). Decoded once at import into int8 arrays
[codes, 8 or 4]. Do not edit by hand.
"""

from __future__ import annotations

import numpy as np

'''

TAIL = '''

def _decode(hex_text: str, values: tuple[int, ...], shape: tuple[int, int]) -> np.ndarray:
    """The packed hex grid as int8 [codes, width]."""
    raw = np.frombuffer(bytes.fromhex(hex_text), np.uint8)
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


GRID_IQ2_XXS = _decode(_HEX["IQ2_XXS"], _VALUES["IQ2_XXS"], (256, 8))
GRID_IQ2_XS = _decode(_HEX["IQ2_XS"], _VALUES["IQ2_XS"], (512, 8))
GRID_IQ2_S = _decode(_HEX["IQ2_S"], _VALUES["IQ2_S"], (1024, 8))
GRID_IQ3_XXS = _decode(_HEX["IQ3_XXS"], _VALUES["IQ3_XXS"], (256, 4))
GRID_IQ3_S = _decode(_HEX["IQ3_S"], _VALUES["IQ3_S"], (512, 4))
GRID_IQ1_S = _decode(_HEX["IQ1_S"], _VALUES["IQ1_S"], (2048, 8))  # values -1, 0, 1
SIGNS = _signs()
# IQ4_NL / IQ4_XS: the 16 non-uniform levels a 4-bit code selects (ggml's kvalues_iq4nl)
IQ4_LEVELS = np.array({levels}, np.int8)
'''


def main() -> None:
    lines = ["_VALUES: dict[str, tuple[int, ...]] = {"]
    for name in GRIDS:
        lines.append(f'    "{name}": {tuple(getattr(quants, name).grid_map)},')
    lines.append("}")
    lines.append("_HEX: dict[str, str] = {")
    for name in GRIDS:
        text = getattr(quants, name).grid_hex.decode("ascii")
        lines.append(f'    "{name}": (')
        lines += [f'        "{part}"' for part in textwrap.wrap(text, 88)]
        lines.append("    ),")
    lines.append("}")
    levels = list(quants.IQ4_NL.kvalues)
    OUT.write_text(HEAD.format(version=version("gguf"))
                   + "\n".join(lines) + TAIL.format(levels=levels))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
