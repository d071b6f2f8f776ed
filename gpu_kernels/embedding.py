"""Embedding lookup on a quantized table: out[t] = dequantized row ids[t] of W [V, H].

Only the looked-up rows are read and dequantized (a 129K x 7168 table stays in its blocks).
`embedding_ref` is the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.dequant_ref import element_values
from gpu_kernels.dequant_tile import dequant_tile, plane_args
from gpu_kernels.qformat import GpuQuant


@triton.jit(do_not_specialize=["T"])
def _embedding_kernel(ids_ptr, y_ptr, p0, p1, p2, p3, p4, p5, T, K,
                      QT: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    tmask = t < T
    e = (tl.program_id(1) * BK + tl.arange(0, BK))[None, :]
    r = tl.load(ids_ptr + t, mask=tmask, other=0).to(tl.int64)[:, None]
    w = dequant_tile(QT, p0, p1, p2, p3, p4, p5, r, e, K, tmask[:, None])
    tl.store(y_ptr + t.to(tl.int64)[:, None] * K + e, w, mask=tmask[:, None])


def embedding(ids: torch.Tensor, w: GpuQuant, out: torch.Tensor | None = None) -> torch.Tensor:
    """ids: [T] int (on w's device) -> [T, H] f32."""
    t = ids.numel()
    out = out if out is not None else torch.empty(t, w.cols, dtype=torch.float32,
                                                  device=ids.device)
    bk = 64 if w.cols % 64 == 0 else 32
    if t:
        _embedding_kernel[(triton.cdiv(t, 4), w.cols // bk)](
            ids, out, *plane_args(w.planes), t, w.cols, QT=w.qtype, BT=4, BK=bk, num_warps=4)
    return out


def embedding_ref(ids: torch.Tensor, w: GpuQuant) -> torch.Tensor:
    return element_values(w, ids.reshape(-1).long(), torch.arange(w.cols))
