"""Page-locking host memory that already holds the experts (the GGUF's memory map), so the
GPU's copy engine reads it directly at PCIe speed without a second, pinned copy.

`cudaHostRegister` locks the pages of a range and maps them for DMA. The GGUF is mapped
read-only, so the ranges are registered read-only (cudaHostRegisterReadOnly) where the device
supports it. Ranges are widened to whole pages and merged first: a page can be registered
once only, and two tensors of one file may share their boundary page.

Registered pages stay resident (that is the point): they are the page cache of the file the
CPU experts read anyway, so nothing is added to the host memory the model already uses.
scripts/probe_pinned_source.py measured this against a pinned ring fed by host copies.
"""

from __future__ import annotations

import contextlib
import logging
import mmap

import numpy as np
import torch

log = logging.getLogger("hybrid.engine")

PORTABLE, READ_ONLY = 1, 8  # cudaHostRegister flags


def byte_ranges(arrays: list[np.ndarray]) -> list[tuple[int, int]]:
    """The page-aligned [start, end) address ranges covering `arrays`, merged where they touch
    or overlap, in address order."""
    page = mmap.PAGESIZE
    spans = sorted((a.ctypes.data // page * page, -(-(a.ctypes.data + a.nbytes) // page) * page)
                   for a in arrays if a.nbytes)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _clear_last_error() -> None:
    """A failed cudaHostRegister leaves CUDA's per-thread last error set, and torch's next
    kernel-launch check would raise it (seen: "part or all of the requested memory range is
    already mapped" surfacing at an unrelated launch). torch binds no cudaGetLastError: call
    it in the runtime library torch already loaded (found by its soname)."""
    import ctypes
    import os

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue
    log.warning("could not clear CUDA's last error after a failed registration")


class HostRegistration:
    """The arrays' pages registered with the CUDA driver until `release` (or the object is
    collected). `ok` is False when the driver refused: copies then go from pageable memory
    (the driver stages them; slower, still correct)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        # NOTE: the arrays are held until the pages are unregistered: memory freed (unmapped)
        # while registered leaves the driver a stale range, and a later allocation at the same
        # address then fails to copy ("invalid argument")
        self._arrays = list(arrays)
        self.ranges: list[tuple[int, int]] = []
        self.nbytes = 0
        cudart = torch.cuda.cudart()
        for start, end in byte_ranges(self._arrays):
            err = 0
            for flags in (PORTABLE | READ_ONLY, PORTABLE):
                err = int(cudart.cudaHostRegister(start, end - start, flags))
                if err == 0:
                    break
            if err != 0:
                _clear_last_error()
                log.warning("could not page-lock %.2f GB of expert weights for streaming "
                            "(cudaHostRegister error %d); streamed copies go through pageable "
                            "memory", (end - start) / 1e9, err)
                self.release()
                break
            self.ranges.append((start, end))
            self.nbytes += end - start

    @property
    def ok(self) -> bool:
        return bool(self.ranges)

    def release(self) -> None:
        cudart = torch.cuda.cudart()
        for start, _ in self.ranges:
            cudart.cudaHostUnregister(start)
        self.ranges, self.nbytes, self._arrays = [], 0, []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the driver may be gone
            self.release()
