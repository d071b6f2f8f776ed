"""cpu_kernels' packed expert bytes turned into the GPU kernels' planes by one kernel a type:

    unpack(data, qtype, rows, cols) -> GpuQuant     equal to packed_planes.planes_from_packed

data [E, rows / 8, row group bytes] (or [E, bytes an expert]) uint8 on the device. Q4_K and
Q8_0 (the types of the experts' gate/up and of a width-1408 down) run here; every other type
goes to the reference's torch ops. Why a kernel: the reference's permutes copy each field in
its own strided pass, and the expert stream unpacks every layer a long prompt streams
(hybrid/engine/prefill/expert_stream.py).

The packed layout (cpu_kernels/fast/packed.py) only moves the GGUF's fields; per group of 8
interleaved rows and one block (packed_planes.GEOMETRY):
  Q4_K, 1216 bytes: words [4][8][row] of codes, bytes [8][row] of scales, of mins, f32 [row]
      of d, of dmin  ->  qs [n, K/2], sc [n, K/32], mn [n, K/32], d, dmin f16 [n, K/256]
  Q8_0, 288 bytes: words [8 steps][row] of codes + 128, f32 [row] of d
      ->  qs int8 [n, K], d f16 [n, K/32]
One program a group of 8 rows and a run of its blocks (contiguous bytes), writing those rows'
columns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels import qtypes as qt
from gpu_kernels.device_function import INTERPRETED
from gpu_kernels.packed_planes import GEOMETRY, ROWS, planes_from_packed
from gpu_kernels.qformat import GpuQuant

UNPACKED = (qt.Q4_K, qt.Q8_0)  # the types with a kernel here
# blocks a program reads per row group: 2048 code words either way
TILE = {qt.Q4_K: 8, qt.Q8_0: 32}
ROWS_C: tl.constexpr = tl.constexpr(ROWS)
FLIP_C: tl.constexpr = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as int32: each byte's top bit


@triton.jit
def _q4_k_kernel(words_ptr, bytes_ptr, qs_ptr, sc_ptr, mn_ptr, d_ptr, dmin_ptr, blocks,
                 BLOCKS: tl.constexpr):
    group = tl.program_id(0).to(tl.int64)  # 8 rows of one expert
    first = tl.program_id(1) * BLOCKS  # this program's blocks: first .. first + BLOCKS - 1
    base = group * blocks * 304  # words: a block is 1216 bytes
    r = tl.arange(0, ROWS_C)[None, :]  # [1, 8] the row within the group
    # codes: block b's word 8 i + j of row r is packed word 64 i + 8 j + r
    bw = tl.arange(0, BLOCKS * 32)[:, None]  # [B * 32, 1]: block b, word w
    b, w = first + bw // 32, bw % 32
    ok = b < blocks
    v = tl.load(words_ptr + base + b * 304 + w * 8 + r, mask=ok)
    row0 = group * ROWS_C
    tl.store(qs_ptr + (row0 + r) * (blocks * 32) + b * 32 + w, v, mask=ok)
    # scales and mins: block b's byte s of row r is packed byte 1024 + 8 s + r (1088 + ..)
    bs = tl.arange(0, BLOCKS * 8)[:, None]  # [B * 8, 1]
    b, s = first + bs // 8, bs % 8
    ok = b < blocks
    at = base * 4 + b * 1216 + s * 8 + r
    out = (row0 + r) * (blocks * 8) + b * 8 + s
    tl.store(sc_ptr + out, tl.load(bytes_ptr + at + 1024, mask=ok), mask=ok)
    tl.store(mn_ptr + out, tl.load(bytes_ptr + at + 1088, mask=ok), mask=ok)
    # d and dmin: f32 words 288 + r and 296 + r of block b, widened from f16 when packed
    b = first + tl.arange(0, BLOCKS)[:, None]  # [B, 1]
    ok = b < blocks
    at = base + b * 304 + r
    out = (row0 + r) * blocks + b
    d = tl.load(words_ptr + at + 288, mask=ok).to(tl.float32, bitcast=True)
    dmin = tl.load(words_ptr + at + 296, mask=ok).to(tl.float32, bitcast=True)
    tl.store(d_ptr + out, d.to(tl.float16), mask=ok)
    tl.store(dmin_ptr + out, dmin.to(tl.float16), mask=ok)


@triton.jit
def _q8_0_kernel(words_ptr, qs_ptr, d_ptr, blocks, BLOCKS: tl.constexpr):
    group = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * BLOCKS
    base = group * blocks * 72  # words: a block is 288 bytes
    r = tl.arange(0, ROWS_C)[None, :]
    row0 = group * ROWS_C
    # codes: block b's word s of row r (its columns 4 s .. 4 s + 3) is packed word 8 s + r,
    # each byte offset by 128
    bs = tl.arange(0, BLOCKS * 8)[:, None]
    b, s = first + bs // 8, bs % 8
    ok = b < blocks
    v = tl.load(words_ptr + base + b * 72 + s * 8 + r, mask=ok)
    tl.store(qs_ptr + (row0 + r) * (blocks * 8) + b * 8 + s, v ^ FLIP_C, mask=ok)
    b = first + tl.arange(0, BLOCKS)[:, None]
    ok = b < blocks
    d = tl.load(words_ptr + base + b * 72 + 64 + r, mask=ok).to(tl.float32, bitcast=True)
    tl.store(d_ptr + (row0 + r) * blocks + b, d.to(tl.float16), mask=ok)


def unpack(data: torch.Tensor, qtype: int, rows: int, cols: int) -> GpuQuant:
    """data: packed bytes [E, rows / 8, row group bytes] uint8 of E experts of `rows` x `cols`
    (contiguous) -> GpuQuant of E * rows rows, as packed_planes.planes_from_packed gives.
    Host tensors outside Triton's interpreter go to the reference."""
    if qtype not in UNPACKED or rows % ROWS or data.storage_offset() % 4 or \
            not (data.is_cuda or INTERPRETED):
        return planes_from_packed(data, qtype, rows, cols)
    block, size = GEOMETRY[qtype]
    blocks = cols // block
    e = data.shape[0]
    n = e * rows
    if data.dtype != torch.uint8 or not data.is_contiguous() or \
            data.numel() != e * (rows // ROWS) * blocks * size:
        raise ValueError(f"unpack: data {tuple(data.shape)} {data.dtype} is not {e} experts "
                         f"of {rows} x {cols} {qt.name(qtype)} packed contiguously")
    flat = data.reshape(-1)
    words = flat.view(torch.int32)
    dev = data.device
    width = min(TILE[qtype], triton.next_power_of_2(blocks))
    grid = (n // ROWS, triton.cdiv(blocks, width))
    f16 = {"dtype": torch.float16, "device": dev}
    if qtype == qt.Q4_K:
        qs = torch.empty(n, blocks * 128, dtype=torch.uint8, device=dev)
        sc = torch.empty(n, blocks * 8, dtype=torch.uint8, device=dev)
        mn = torch.empty_like(sc)
        d, dmin = torch.empty(n, blocks, **f16), torch.empty(n, blocks, **f16)
        _q4_k_kernel[grid](words, flat, qs.view(torch.int32), sc, mn, d, dmin, blocks,
                           BLOCKS=width, num_warps=4)
        planes = (qs, sc, mn, d, dmin)
    else:
        qs = torch.empty(n, blocks * 32, dtype=torch.int8, device=dev)
        d = torch.empty(n, blocks, **f16)
        _q8_0_kernel[grid](words, qs.view(torch.int32), d, blocks, BLOCKS=width, num_warps=4)
        planes = (qs, d)
    return GpuQuant(qtype, n, cols, planes)
