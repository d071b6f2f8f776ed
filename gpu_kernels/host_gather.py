"""Rows of page-locked host memory gathered into device memory by a kernel, the rows chosen on
the device:

    gather_rows(src, which, dst)    dst[s] = src[which[s]] for every s with which[s] >= 0

src [E, B] uint8 lies in host memory registered with CUDA (read by the SMs over PCIe, mapped:
no copy engine, no host call per row), which [S] int64 and dst [S, B] uint8 on the device.
Why a kernel and not copies: the rows are a step's routed experts, known only on the device
once its router ran, inside a CUDA graph; a copy per row would need the host to read the ids.
Slots whose `which` is negative keep their bytes. `gather_rows_ref` defines the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# words a program copies: 8 KiB, so one expert's tensor spreads over hundreds of programs and
# enough reads are in flight over PCIe (scripts/probe_split_experts.py's kernel)
BLOCK = 2048


@triton.jit(do_not_specialize=["words"])
def _gather_kernel(src_ptr, which_ptr, dst_ptr, words, BLOCK: tl.constexpr):
    chunk = tl.program_id(0)
    slot = tl.program_id(1)
    row = tl.load(which_ptr + slot)
    if row >= 0:
        offs = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < words
        # volatile: host memory, read once; never cached across launches
        v = tl.load(src_ptr + row * words + offs, mask=mask, volatile=True)
        tl.store(dst_ptr + slot.to(tl.int64) * words + offs, v, mask=mask)


def gather_rows(src: torch.Tensor, which: torch.Tensor, dst: torch.Tensor) -> None:
    """src [E, B] uint8 (pinned or registered host memory; any host memory where dst is on
    the CPU, as Triton's interpreter runs it), which [S] int64, dst [S, B] uint8, contiguous."""
    if src.dim() != 2 or dst.dim() != 2 or src.shape[1] != dst.shape[1] or \
            which.shape != (dst.shape[0],) or src.dtype != torch.uint8 or \
            dst.dtype != torch.uint8 or not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError(f"gather_rows: src {tuple(src.shape)} {src.dtype}, which "
                         f"{tuple(which.shape)}, dst {tuple(dst.shape)} {dst.dtype}")
    nbytes = src.shape[1]
    # int32 words where every row starts at a word (the expert tensors' rows do)
    view = torch.int32 if nbytes % 4 == 0 else torch.uint8
    words = nbytes // 4 if view is torch.int32 else nbytes
    grid = (triton.cdiv(words, BLOCK), dst.shape[0])
    _gather_kernel[grid](src.view(view), which, dst.view(view), words, BLOCK=BLOCK,
                         num_warps=4)


def gather_rows_ref(src: torch.Tensor, which: torch.Tensor, dst: torch.Tensor) -> None:
    for s, row in enumerate(which.tolist()):
        if row >= 0:
            dst[s] = src[row].to(dst.device)
