"""cpu_kernels' packed expert layout (cpu_kernels/fast/packed.py) turned back into the GPU kernels'
planes (gpu_kernels/qformat.py), on the GPU, so fast mode streams the copy its CPU kernels
already hold instead of page-locking the GGUF's bytes beside it.

The packed layout only moves the GGUF's fields (8 rows interleaved per block, f16 scales
widened to f32, 6-bit scales unpacked, Q8_0 codes offset by 128, Q6_K/Q5_0 codes regrouped by
bit): each plane is recovered exactly, by permutes and bit operations. `planes_from_packed`
equals `to_planes` on the GGUF's bytes (tests/test_packed_planes.py).

Packed bytes per 8 rows x block (cpu_kernels/fast/packed.py): Q4_K 1216, Q6_K 1696, Q8_0 288,
Q5_0 192, Q2_K 704, Q3_K 928: every type cpu_kernels packs.
"""

from __future__ import annotations

import torch

from gpu_kernels import qtypes as qt
from gpu_kernels.qformat import GpuQuant

ROWS = 8  # rows interleaved per packed group
# qtype -> (columns per block, packed bytes per 8 rows x block)
GEOMETRY = {qt.Q4_K: (256, 1216), qt.Q6_K: (256, 1696), qt.Q8_0: (32, 288), qt.Q5_0: (32, 192),
            qt.Q2_K: (256, 704), qt.Q3_K: (256, 928)}


def can_unpack(qtype: int, rows: int) -> bool:
    return qtype in GEOMETRY and rows % ROWS == 0


def _rows(t: torch.Tensor, order: tuple[int, ...], rows: int) -> torch.Tensor:
    """t [E, G, B, ..., 8 rows at dim order-picked, ...] permuted by `order` to [E, G, row, B, ...]
    and flattened to a plane [E * G * 8, -1]."""
    return t.permute(order).reshape(rows, -1)


def _f32_to_f16(p: torch.Tensor, rows: int) -> torch.Tensor:
    """[E, G, B, 32] bytes of 8 f32 per block -> [rows, B] f16 (the values came from f16)."""
    d = p.contiguous().view(torch.float32)  # [E, G, B, 8]
    return _rows(d, (0, 1, 3, 2), rows).to(torch.float16)


def _codes(steps: torch.Tensor, rows: int) -> torch.Tensor:
    """Row-interleaved steps [E, G, B, S, 32] (byte 4r + j of step s: row r, column 4s + j) ->
    codes [rows, B * 4S] in column order. A row's 4 bytes of a step stay together: they move
    as one int32 word (a quarter of the elements a byte-wise permute copies)."""
    words = steps.view(torch.int32)  # [E, G, B, S, 8]: row r's 4 codes of step s
    return _rows(words, (0, 1, 4, 2, 3), rows).contiguous().view(torch.uint8)


def planes_from_packed(data: torch.Tensor, qtype: int, rows: int, cols: int) -> GpuQuant:
    """data: packed bytes [E, rows / 8, row group bytes] uint8 of E experts of `rows` x `cols`,
    on any device -> GpuQuant of E * rows rows (expert e's row n is e * rows + n)."""
    if not can_unpack(qtype, rows):
        raise ValueError(f"no unpacking of {qt.name(qtype)} experts of {rows} rows")
    block, size = GEOMETRY[qtype]
    e = data.shape[0]
    n = e * rows
    p = data.reshape(e, rows // ROWS, cols // block, size)  # [E, G, B, size]
    if qtype == qt.Q4_K:
        words = p[..., :1024].view(torch.int32).reshape(*p.shape[:3], 4, 8, ROWS)  # 4 bytes
        qs = _rows(words, (0, 1, 5, 2, 3, 4), n).contiguous().view(torch.uint8)
        sc = _rows(p[..., 1024:1088].reshape(*p.shape[:3], 8, ROWS), (0, 1, 4, 2, 3), n)
        mn = _rows(p[..., 1088:1152].reshape(*p.shape[:3], 8, ROWS), (0, 1, 4, 2, 3), n)
        planes = (qs, sc, mn, _f32_to_f16(p[..., 1152:1184], n), _f32_to_f16(p[..., 1184:], n))
    elif qtype == qt.Q8_0:
        qs = (_codes(p[..., :256].reshape(*p.shape[:3], 8, 32), n) ^ 0x80).view(torch.int8)
        planes = (qs, _f32_to_f16(p[..., 256:], n))
    elif qtype == qt.Q6_K:
        planes = (*_q6_k_fields(p, n), _f32_to_f16(p[..., 1664:], n))
    elif qtype == qt.Q5_0:
        planes = (*_q5_0_fields(p, n), _f32_to_f16(p[..., 160:], n))
    elif qtype == qt.Q2_K:
        sc = _rows(p[..., 512:640].reshape(*p.shape[:3], 16, ROWS), (0, 1, 4, 2, 3), n)
        planes = (_low_bytes(p[..., :512], n), sc, _f32_to_f16(p[..., 640:672], n),
                  _f32_to_f16(p[..., 672:], n))
    else:  # Q3_K
        sc = _rows(p[..., 768:896].reshape(*p.shape[:3], 16, ROWS), (0, 1, 4, 2, 3), n)
        planes = (_q3_k_hmask(p[..., 512:768], n), _low_bytes(p[..., :512], n),
                  sc.view(torch.int8), _f32_to_f16(p[..., 896:], n))
    return GpuQuant(qtype, n, cols, tuple(t.contiguous() for t in planes))


def _q6_k_fields(p: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """-> (ql [n, K/2], qh [n, K/4], scales int8 [n, K/16]) of Q6_K's packed blocks."""
    q = p[..., :1536].reshape(*p.shape[:3], 16, 3, 32)  # [sub][nibbles 0|1, 2|3, highs][32]
    n01, n23, hb = q[..., 0, :], q[..., 1, :], q[..., 2, :]
    steps = torch.stack([(n01 & 15) | ((hb & 3) << 4), (n01 >> 4) | (((hb >> 2) & 3) << 4),
                         (n23 & 15) | (((hb >> 4) & 3) << 4), (n23 >> 4) | ((hb >> 6) << 4)],
                        dim=4)  # [E, G, B, 16, 4, 32]: step 4 * sub + i
    c = _codes(steps.reshape(*p.shape[:3], 64, 32), n).reshape(n, -1, 2, 4, 32)  # [.., n, q, l]
    ql = torch.stack([(c[..., 0, :] & 15) | ((c[..., 2, :] & 15) << 4),
                      (c[..., 1, :] & 15) | ((c[..., 3, :] & 15) << 4)], dim=-2)  # [.., 2, 2, 32]
    qh = (c[..., 0, :] >> 4) | ((c[..., 1, :] >> 4) << 2) | ((c[..., 2, :] >> 4) << 4) \
        | ((c[..., 3, :] >> 4) << 6)  # [n, B, 2, 32]
    sc = _rows(p[..., 1536:1664].reshape(*p.shape[:3], 16, ROWS), (0, 1, 4, 2, 3), n)
    return ql.reshape(n, -1), qh.reshape(n, -1), sc.view(torch.int8)


def _q5_0_fields(p: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (qs [n, K/2], qh int32 [n, K/32]) of Q5_0's packed blocks."""
    nib = p[..., :128].reshape(*p.shape[:3], 4, 32)  # steps 2m | 2m + 1
    hb = p[..., 128:160]  # bit 4 of step i's codes at bit i
    steps = torch.stack([(nib[..., m // 2, :] >> (4 * (m % 2))) & 15 | (((hb >> m) & 1) << 4)
                         for m in range(8)], dim=3)  # [E, G, B, 8, 32]
    c = _codes(steps, n).reshape(n, -1, 32)  # [n, B, 32] 5-bit codes in column order
    qs = (c[..., :16] & 15) | ((c[..., 16:] & 15) << 4)  # [n, B, 16]
    bits = ((c >> 4) & 1).reshape(n, -1, 4, 8)  # [n, B, byte, bit]
    # [n, B, 4] little-endian bytes: ORs of shifted bits (elementwise; torch's byte-sum
    # reduction over 8 was the slowest op of the unpacking, docs/long-prompts.md)
    qh = _bits_to_bytes(bits.transpose(-1, -2), 1)
    return qs.reshape(n, -1), qh.reshape(n, -1).contiguous().view(torch.int32)


def _bits_to_bytes(bits: torch.Tensor, width: int) -> torch.Tensor:
    """bits [..., F, L] fields of `width` bits -> [..., L] bytes, field f at bit width * f."""
    out = bits[..., 0, :].clone()
    for f in range(1, bits.shape[-2]):
        out |= bits[..., f, :] << (width * f)
    return out


def _low_bytes(t: torch.Tensor, n: int) -> torch.Tensor:
    """Q2_K/Q3_K's packed 2-bit codes [E, G, B, 512] (step i of sub-block p at bits 2i) -> the
    GGUF's qs [n, K/4]: element 128 m + 32 j + l at bits 2j of byte 32 m + l."""
    v = t.reshape(*t.shape[:3], 16, 32)
    steps = torch.stack([(v >> (2 * i)) & 3 for i in range(4)], dim=4)  # [E, G, B, 16, 4, 32]
    c = _codes(steps.reshape(*t.shape[:3], 64, 32), n).reshape(n, -1, 2, 4, 32)
    return _bits_to_bytes(c, 2).reshape(n, -1)  # [n, B, 2, 32] -> 64 bytes a block


def _q3_k_hmask(t: torch.Tensor, n: int) -> torch.Tensor:
    """Q3_K's packed high bits [E, G, B, 256] (per pair of sub-blocks, step i's bit at bit i,
    odd sub-block + 4) -> the GGUF's hmask [n, K/8]: element 32 i + l at bit i of byte l."""
    h = t.reshape(*t.shape[:3], 8, 32)
    nib = torch.stack([h & 15, h >> 4], dim=4)  # [E, G, B, pair, odd, 32]
    steps = torch.stack([(nib >> i) & 1 for i in range(4)], dim=5)  # [.., pair, odd, i, 32]
    bits = _codes(steps.reshape(*t.shape[:3], 64, 32), n).reshape(n, -1, 8, 32)
    return _bits_to_bytes(bits, 1).reshape(n, -1)  # [n, B, 32]
