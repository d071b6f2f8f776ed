"""GGUF blocks as the GPU kernels read them: each block field in a plane of its own.

A GGUF row is an array of packed structs (Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales,
128 bytes of nibbles = 144 bytes), mostly at odd alignments (Q6_K's 210-byte blocks, Q8_0's 34).
`to_planes` splits the structs at load time into one contiguous array per field, `[rows, ...]`,
so a kernel's loads are aligned and the same field of neighbouring blocks is adjacent. The bytes
are the file's: nothing is rounded. Two types also unpack their 6-bit scales into a byte each
(Q4_K/Q5_K: 12 -> 16 bytes per 256 weights, Q3_K: 12 -> 16): at most 1.04x the GGUF bytes.

Planes per type (K = columns; every plane is row-major with `rows` rows):
    F32/F16/BF16  w [K]
    Q8_0   qs int8 [K]    d f16 [K/32]
    Q4_0   qs u8 [K/2]    d f16 [K/32]
    Q4_1   qs u8 [K/2]    d f16 [K/32]   m f16 [K/32]
    Q5_0   qs u8 [K/2]    qh i32 [K/32]  d f16 [K/32]
    Q5_1   qs u8 [K/2]    qh i32 [K/32]  d f16 [K/32]  m f16 [K/32]
    Q2_K   qs u8 [K/4]    sc u8 [K/16] (scale | min << 4)   d f16 [K/256]  dmin f16 [K/256]
    Q3_K   hm u8 [K/8]    qs u8 [K/4]    sc i8 [K/16] (signed, -32 applied)  d f16 [K/256]
    Q4_K   qs u8 [K/2]    sc u8 [K/32]   mn u8 [K/32]   d f16 [K/256]  dmin f16 [K/256]
    Q5_K   qs u8 [K/2]    qh u8 [K/8]    sc u8 [K/32]   mn u8 [K/32]  d f16 [K/256]  dmin
    Q6_K   ql u8 [K/2]    qh u8 [K/4]    sc i8 [K/16]   d f16 [K/256]
    IQ4_NL qs u8 [K/2]    d f16 [K/32]                     (nibbles select IQ4_LEVELS)
    IQ4_XS qs u8 [K/2]    sc i8 [K/32] (signed, -32 applied)  d f16 [K/256]
    MXFP4  qs u8 [K/2]    e u8 [K/32] (E8M0: scale 2^(e - 128))  (nibbles select MXFP4_LEVELS)
(IQ4_XS's 6-bit scales unpacked to a byte each: 136 -> 138 bytes per 256 weights.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from gpu_kernels import qtypes as qt


@dataclass(frozen=True)
class GpuQuant:
    """A quantized (or float) matrix [rows, cols] as planes on one device."""

    qtype: int
    rows: int
    cols: int
    planes: tuple[torch.Tensor, ...]
    # 16 or 8: one-token products quantize x to this many bits per 32 columns and take
    # integer dot products where the type has them (qmatmul.INT_PRODUCTS); 0: fp32 x throughout
    x_bits: int = 0
    # products of many tokens (dequant_rows.SCRATCH_MIN_TOKENS and more): True rounds x (rows
    # scaled by powers of two) and the weights to fp16 for tensor cores with fp32 sums; False
    # multiplies in fp32, exact to rounding
    fp16_prompts: bool = False

    @property
    def device(self) -> torch.device:
        return self.planes[0].device

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)

    def to(self, device: torch.device | str) -> GpuQuant:
        return replace(self, planes=tuple(p.to(device) for p in self.planes))


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte `at` of every block: b [R, nb, size] -> [R, nb] f16."""
    return b[..., at:at + 2].contiguous().view(torch.float16)[..., 0]


def _flat(t: torch.Tensor, rows: int) -> torch.Tensor:
    return t.contiguous().reshape(rows, -1)


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12 packed bytes of Q4_K/Q5_K -> (scales, mins), each [R, nb, 8] u8 (6-bit values)."""
    s = s.to(torch.int32)
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], dim=-1)
    mn = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], dim=-1)
    return sc.to(torch.uint8), mn.to(torch.uint8)


def _q3_scales(s: torch.Tensor) -> torch.Tensor:
    """The 12 packed bytes of Q3_K -> 16 signed scales [R, nb, 16] int8 (value - 32)."""
    s = s.to(torch.int32)
    low = torch.cat([s[..., 0:8] & 15, s[..., 0:8] >> 4], dim=-1)  # [R, nb, 16]
    i = torch.arange(16, device=s.device)
    high = (s[..., 8 + (i % 4)] >> (2 * (i // 4))) & 3
    return ((low | (high << 4)) - 32).to(torch.int8)


def _iq4_xs_scales(b: torch.Tensor) -> torch.Tensor:
    """IQ4_XS blocks [R, nb, 136] -> the 8 signed sub-block scales [R, nb, 8] int8 (value - 32):
    low nibbles at bytes 4..7, two high bits each in the u16 at bytes 2..3."""
    high = b[..., 2].to(torch.int32) | (b[..., 3].to(torch.int32) << 8)  # [R, nb]
    s = torch.arange(8, device=b.device)
    low = (b[..., 4 + s // 2].to(torch.int32) >> (4 * (s % 2))) & 15
    return ((low | (((high[..., None] >> (2 * s)) & 3) << 4)) - 32).to(torch.int8)


def to_planes(raw: torch.Tensor, qtype: int, rows: int, cols: int) -> GpuQuant:
    """raw: the tensor's GGUF bytes (uint8, any shape with rows * row_bytes elements) or, for
    F32/F16/BF16, its elements; on any device. -> the planes on raw's device."""
    if qtype in qt.FLOAT_DTYPES:
        w = raw.reshape(-1).view(torch.uint8).view(qt.FLOAT_DTYPES[qtype]).reshape(rows, cols)
        return GpuQuant(qtype, rows, cols, (w.contiguous(),))
    if qtype not in qt.BLOCK_GEOMETRY:
        raise ValueError(f"gpu_kernels has no kernel for type {qt.name(qtype)}")
    block, size = qt.BLOCK_GEOMETRY[qtype]
    if cols % block:
        raise ValueError(f"{qt.name(qtype)} rows of {cols} are not whole blocks of {block}")
    b = raw.reshape(-1).view(torch.uint8).reshape(rows, cols // block, size)

    def flat(t: torch.Tensor) -> torch.Tensor:
        return _flat(t, rows)

    if qtype == qt.Q8_0:
        planes = (flat(b[..., 2:]).view(torch.int8), _f16(b, 0))
    elif qtype in (qt.Q4_0, qt.IQ4_NL):
        planes = (flat(b[..., 2:18]), _f16(b, 0))
    elif qtype == qt.MXFP4:  # the exponent byte stays a byte: 2^(e - 128) is made in the kernel
        planes = (flat(b[..., 1:17]), b[..., 0])
    elif qtype == qt.IQ4_XS:
        planes = (flat(b[..., 8:136]), flat(_iq4_xs_scales(b)), _f16(b, 0))
    elif qtype == qt.Q4_1:
        planes = (flat(b[..., 4:20]), _f16(b, 0), _f16(b, 2))
    elif qtype == qt.Q5_0:
        planes = (flat(b[..., 6:22]), flat(b[..., 2:6]).view(torch.int32), _f16(b, 0))
    elif qtype == qt.Q5_1:
        planes = (flat(b[..., 8:24]), flat(b[..., 4:8]).view(torch.int32), _f16(b, 0),
                  _f16(b, 2))
    elif qtype == qt.Q2_K:
        planes = (flat(b[..., 16:80]), flat(b[..., 0:16]), _f16(b, 80), _f16(b, 82))
    elif qtype == qt.Q3_K:
        planes = (flat(b[..., 0:32]), flat(b[..., 32:96]), flat(_q3_scales(b[..., 96:108])),
                  _f16(b, 108))
    elif qtype == qt.Q4_K:
        sc, mn = _k4_scales(b[..., 4:16])
        planes = (flat(b[..., 16:144]), flat(sc), flat(mn), _f16(b, 0), _f16(b, 2))
    elif qtype == qt.Q5_K:
        sc, mn = _k4_scales(b[..., 4:16])
        planes = (flat(b[..., 48:176]), flat(b[..., 16:48]), flat(sc), flat(mn), _f16(b, 0),
                  _f16(b, 2))
    else:  # Q6_K
        planes = (flat(b[..., 0:128]), flat(b[..., 128:192]), flat(b[..., 192:208]).view(torch.int8),
                  _f16(b, 208))
    return GpuQuant(qtype, rows, cols, tuple(p.contiguous() for p in planes))
