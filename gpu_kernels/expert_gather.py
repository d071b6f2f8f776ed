"""Experts' planes kept in page-locked host memory, and the ones a step uses copied to the device
in one launch before the grouped products read them:

    layout = host_layout(parts, experts, device)   every plane of `parts` (qformat's GpuQuants,
                                                   rows expert-major) in ONE host buffer, each
                                                   plane at an aligned offset
    layout.views(buffer)                           the parts as GpuQuants over any buffer of
                                                   that layout (a device one, for the products)
    gather_used(layout, dst, used)                 for every expert e with used[e] != 0 and
                                                   every plane: dst[e's range] = host[e's range]

Why copy first rather than let the products read host memory in place: a product's tile reads a
plane row by row, and the scale planes give a few bytes a row, so in place the GPU issues many
small PCIe reads; the copy reads each used expert's ranges whole, 8 KiB a program (many
programs in flight), and the products then read device memory. Nothing synchronizes with the
host and the grid is fixed (the experts held, the planes): a CUDA graph holds the launch.
`gather_used_ref` defines the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from gpu_kernels.qformat import GpuQuant

ALIGN = 256  # bytes: each plane starts aligned, as an allocation would
BLOCK = 2048  # words a program copies


class HostMemoryUnavailable(RuntimeError):
    """The host would not page-lock the layout's bytes (its memory, or the locked-memory
    limit): the planes cannot be read over PCIe."""


@dataclass(frozen=True)
class HostLayout:
    parts: tuple[GpuQuant, ...]  # the planes as views of `host`
    host: torch.Tensor  # [nbytes] uint8, page-locked where the device is a GPU
    offsets: tuple[int, ...]  # byte offset of each plane (parts' planes in order)
    table: torch.Tensor  # [P, 2] int64 on the device: (first word, words an expert) a plane
    experts: int
    word_bytes: int  # 4 where every plane's expert range is whole int32 words, else 1
    most_words: int  # the largest expert range of a plane, in words

    @property
    def nbytes(self) -> int:
        return self.host.numel()

    def views(self, buffer: torch.Tensor) -> tuple[GpuQuant, ...]:
        """`parts` over `buffer` ([>= nbytes] uint8, any device) at the same offsets."""
        return _views(self.parts, buffer, self.offsets)


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


def _views(parts, buffer: torch.Tensor, offsets) -> tuple[GpuQuant, ...]:
    out, i = [], 0
    for q in parts:
        planes = []
        for p in q.planes:
            at = offsets[i]
            planes.append(buffer[at:at + _nbytes(p)].view(p.dtype).view(p.shape))
            i += 1
        out.append(replace(q, planes=tuple(planes)))
    return tuple(out)


def host_layout(parts: list[GpuQuant], experts: int, device: torch.device) -> HostLayout:
    """Copy `parts` (each [experts * R, ...] planes, on any device) into one host buffer,
    page-locked where `device` is a GPU; `table` lives on `device`. Raises
    HostMemoryUnavailable where the host refuses to lock it."""
    planes = [p for q in parts for p in q.planes]
    offsets, at = [], 0
    for p in planes:
        offsets.append(at)
        at += -(-_nbytes(p) // ALIGN) * ALIGN
    try:
        host = torch.empty(at, dtype=torch.uint8, pin_memory=device.type == "cuda")
    except RuntimeError as e:  # cudaHostAlloc's out of memory
        raise HostMemoryUnavailable(f"{at / 2**20:.0f} MiB of page-locked host memory: "
                                    f"{e}") from None
    for p, off in zip(planes, offsets):
        host[off:off + _nbytes(p)].copy_(p.contiguous().reshape(-1).view(torch.uint8))
    sizes = [_nbytes(p) for p in planes]
    if any(s % experts for s in sizes):
        raise ValueError(f"planes of {sizes} bytes are not {experts} experts' equal ranges")
    word = 4 if all(s // experts % 4 == 0 for s in sizes) else 1
    table = torch.tensor([[off // word, s // experts // word] for off, s in zip(offsets, sizes)],
                         dtype=torch.int64, device=device)
    return HostLayout(_views(parts, host, offsets), host, tuple(offsets), table, experts, word,
                      max(s // experts // word for s in sizes))


@triton.jit
def _gather_used_kernel(src_ptr, dst_ptr, table_ptr, used_ptr, BLOCK: tl.constexpr):
    chunk = tl.program_id(0)
    e = tl.program_id(1)
    p = tl.program_id(2)
    if tl.load(used_ptr + e) != 0:
        first = tl.load(table_ptr + 2 * p)
        per = tl.load(table_ptr + 2 * p + 1)
        offs = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < per
        at = first + e.to(tl.int64) * per + offs
        # volatile: host memory, read once; never cached across launches
        v = tl.load(src_ptr + at, mask=mask, volatile=True)
        tl.store(dst_ptr + at, v, mask=mask)


def gather_used(layout: HostLayout, dst: torch.Tensor, used: torch.Tensor) -> None:
    """dst: [>= layout.nbytes] uint8 on the device; used: [experts] int8, nonzero for the
    experts whose ranges to copy (the others' bytes in dst are left as they were)."""
    if dst.dtype != torch.uint8 or dst.numel() < layout.nbytes or \
            used.shape != (layout.experts,):
        raise ValueError(f"gather_used: dst {tuple(dst.shape)} {dst.dtype} for "
                         f"{layout.nbytes} bytes, used {tuple(used.shape)} for "
                         f"{layout.experts} experts")
    view = torch.int32 if layout.word_bytes == 4 else torch.uint8
    grid = (triton.cdiv(layout.most_words, BLOCK), layout.experts, layout.table.shape[0])
    _gather_used_kernel[grid](layout.host.view(view), dst[:layout.nbytes].view(view),
                              layout.table, used, BLOCK=BLOCK, num_warps=4)


def gather_used_ref(layout: HostLayout, dst: torch.Tensor, used: torch.Tensor) -> None:
    w = layout.word_bytes
    for first, per in layout.table.tolist():
        for e in torch.nonzero(used).flatten().tolist():
            a, b = (first + e * per) * w, (first + (e + 1) * per) * w
            dst[a:b] = layout.host[a:b].to(dst.device)
