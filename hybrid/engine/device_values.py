"""Small host lists (row indices, a batch's sampling settings, uniforms) onto the device
without waiting for it.

A copy from pageable memory first waits for everything queued on the stream, so the host stops
queueing work until the GPU catches up; and while a step launched ahead sits on the stream, its
CPU experts not yet driven by the waiting thread, that wait never ends (engine.py's invariant).
A copy from pinned memory is queued like a kernel; torch's pinned allocator keeps the source
until the copy ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def on_device(values: Sequence, device: torch.device, dtype: torch.dtype = torch.int64
              ) -> torch.Tensor:
    """`values` (numbers, or equal-length rows of them) as a `dtype` tensor on `device`,
    queued, never waited for."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
