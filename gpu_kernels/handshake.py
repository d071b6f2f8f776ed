"""Flags between a CUDA graph and a CPU thread, in mapped pinned memory: the GPU raises one when
data it copied to the host is complete, and waits for one the CPU raises when its answer is.

With these a whole decode step is one CUDA graph even though each MoE layer's routed experts run
on the CPU (cpu_kernels/runtime/layer_driver.py is the other side): nothing is launched per layer, and
each hand-over costs a PCIe write and a few polled reads instead of a host wake-up and a launch.

Flags hold a step's sequence number, read from a device int64 (`seq`) that each step loads
from the host's pinned copy (by `fetch`), so they never need resetting and a flag left from an
earlier step never passes for this one.

- signal(flags, index, seq): flags[index] = seq, a system-scope release store. Stream order puts
  it after the copies before it, which are then complete in host memory.
- wait(flags, index, seq, error): spin until flags[index] == seq, polling host memory. After
  `max_spins` polls (~1 us each over PCIe: the default is ~10-20 s) it gives up and sets
  error[0] = index + 1, so a host that died never hangs the GPU; the host checks `error` per
  step (and names the flag that gave up).
- fetch(src, dst): dst = src (pinned host memory), read by a kernel over PCIe. Not a copy: a
  copy from the host queues on a host-to-device copy engine behind whatever that engine carries
  (a long prompt's expert uploads, a layer's experts each), and a decode step's graph would
  wait there at every MoE layer (docs/long-prompts.md, "The copy engine"). With `carried`, an
  int64 fetch also takes values the host does not know yet from the device: a negative entry
  -(j + 1) among the first `span` names carried[j] (a decode's input token that the step before
  sampled and has not read back).

The kernels that consume or produce a hand-over can take its two halves into their own launch
(a whole-step graph's MoE layer then launches two kernels where it launched eight):
`Awaited` is a host answer that the next kernel waits for and reads itself
(fused.add_rmsnorm), `Handover` the pinned buffers and flag that a kernel writes and raises
itself (router.route). `spin` and `raise_flag` are the device functions they share with
`wait` and `signal`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gpu_kernels.device_function import device_function

MAX_SPINS = 10_000_000


@device_function
def raise_flag(flags_ptr, index, seq_ptr):
    """flags[index] = seq: a system-scope release, so every write this program made or saw
    before it (a barrier's, an earlier kernel's in stream order) reaches the host first."""
    seq = tl.load(seq_ptr)
    tl.atomic_xchg(flags_ptr + index, seq, sem="release", scope="sys")


@device_function
def spin(flags_ptr, index, seq_ptr, error_ptr, max_spins):
    """Poll flags[index] until it equals seq; after max_spins polls set error[0] = index + 1
    and return (the host checks `error`: a host that died never hangs the GPU)."""
    seq = tl.load(seq_ptr)
    seen = tl.load(flags_ptr + index, volatile=True)
    spins = 0
    while (seen != seq) & (spins < max_spins):
        seen = tl.load(flags_ptr + index, volatile=True)
        spins += 1
    if seen != seq:
        tl.store(error_ptr, index + 1)


@triton.jit
def _signal_kernel(flags_ptr, index, seq_ptr):
    raise_flag(flags_ptr, index, seq_ptr)


@triton.jit
def _wait_kernel(flags_ptr, index, seq_ptr, error_ptr, max_spins):
    spin(flags_ptr, index, seq_ptr, error_ptr, max_spins)


@triton.jit(do_not_specialize=["n"])  # one variant a dtype, whatever the rows
def _fetch_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # volatile: a system-scope read of what the host wrote before raising the done flag
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask, volatile=True), mask=mask)


@triton.jit(do_not_specialize=["n", "span"])
def _fetch_carried_kernel(src_ptr, dst_ptr, n, carried_ptr, span, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(src_ptr + offs, mask=mask, volatile=True)
    take = mask & (offs < span) & (v < 0)
    # -(j + 1) -> carried[j]; the index is only formed where taken (never negative)
    v = tl.where(take, tl.load(carried_ptr + tl.where(take, -v - 1, 0), mask=take), v)
    tl.store(dst_ptr + offs, v, mask=mask)


def _check(flags: torch.Tensor, index: int, seq: torch.Tensor) -> None:
    if flags.dtype != torch.int64 or seq.dtype != torch.int64 or not 0 <= index < flags.numel():
        raise ValueError(f"flags {flags.dtype}[{flags.numel()}] index {index}, seq {seq.dtype}")


def signal(flags: torch.Tensor, index: int, seq: torch.Tensor) -> None:
    """flags: [L] int64 (mapped pinned)  seq: [1] int64 on the device."""
    _check(flags, index, seq)
    _signal_kernel[(1,)](flags, index, seq, num_warps=1)


def wait(flags: torch.Tensor, index: int, seq: torch.Tensor, error: torch.Tensor,
         max_spins: int = MAX_SPINS) -> None:
    """Block the stream until flags[index] == seq (or set error[0] = index + 1 after
    max_spins)."""
    _check(flags, index, seq)
    _wait_kernel[(1,)](flags, index, seq, error, max_spins, num_warps=1)


FETCH_BLOCK = 1024


def fetch(src: torch.Tensor, dst: torch.Tensor, carried: torch.Tensor | None = None,
          span: int = 0) -> None:
    """dst [...] on the device = src [same shape, dtype] in pinned host memory (any host
    memory where dst is on the CPU, as Triton's interpreter runs it), both contiguous.
    carried: [J] int64 on dst's device, for int64 src: a negative value -(j + 1) among src's
    first `span` entries (flattened) is replaced by carried[j]; the host guarantees j < J."""
    if src.shape != dst.shape or src.dtype != dst.dtype or not (
            src.is_contiguous() and dst.is_contiguous()) or (
            dst.device.type == "cuda" and src.numel() and not src.is_pinned()):
        raise ValueError(f"fetch: pinned contiguous {src.dtype}{tuple(src.shape)} into "
                         f"contiguous {dst.dtype}{tuple(dst.shape)}")
    n = dst.numel()
    if carried is not None:
        if src.dtype != torch.int64 or carried.dtype != torch.int64 \
                or carried.device != dst.device or not 0 <= span <= n:
            raise ValueError(f"fetch: carried {carried.dtype} on {carried.device} for "
                             f"{src.dtype} rows on {dst.device}, span {span} of {n}")
        if n:
            _fetch_carried_kernel[(triton.cdiv(n, FETCH_BLOCK),)](
                src, dst, n, carried, span, BLOCK=FETCH_BLOCK, num_warps=4)
        return
    if n:
        _fetch_kernel[(triton.cdiv(n, FETCH_BLOCK),)](src, dst, n, BLOCK=FETCH_BLOCK,
                                                     num_warps=4)


def fetch_ref(src: torch.Tensor, dst: torch.Tensor, carried: torch.Tensor | None = None,
              span: int = 0) -> None:
    dst.copy_(src)
    if carried is not None:
        head = dst.view(-1)[:span]  # [span]
        taken = head < 0
        head[taken] = carried[(-head[taken] - 1).to(carried.device)].to(dst.device)


def signal_ref(flags: torch.Tensor, index: int, seq: torch.Tensor) -> None:
    flags[index] = seq.to(flags.device)[0]


def wait_ref(flags: torch.Tensor, index: int, seq: torch.Tensor, error: torch.Tensor) -> None:
    """The reference never spins: a flag not yet equal is the error."""
    if int(flags[index]) != int(seq[0]):
        error[0] = index + 1


@dataclass(frozen=True)
class Awaited:
    """Rows the host writes into pinned memory and then raises flags[index] = seq for: a
    device delta that the kernel adding it waits for and reads itself (fused.add_rmsnorm's
    `awaited`), or, where no kernel takes it, `resolve()` waits and fetches it into `dst`.
    src: [T, H] pinned host rows; dst: [T, H] on the device (src itself off a GPU)."""

    src: torch.Tensor
    dst: torch.Tensor
    flags: torch.Tensor  # [L] int64, mapped pinned
    index: int
    seq: torch.Tensor  # [1] int64 on the device
    error: torch.Tensor  # [1] int32, mapped pinned

    def resolve(self) -> torch.Tensor:
        """GPU work: wait for the flag, then dst = src -> dst."""
        wait(self.flags, self.index, self.seq, self.error)
        if self.dst is not self.src:
            fetch(self.src, self.dst)
        return self.dst


@dataclass(frozen=True)
class Handover:
    """Where a kernel that produces a hand-over writes it: the rows x [T, H] and the choices
    ids / weights [T, K], all pinned host memory, then raises flags[index] = seq once every
    program of its launch has written its part (the last one to count itself in `counter`,
    a device int32 [1] that is 0 between launches)."""

    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    flags: torch.Tensor
    index: int
    seq: torch.Tensor
    counter: torch.Tensor

    def send(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
        """GPU work, what a kernel that cannot take the hand-over does instead: three copies,
        then the flag."""
        n = x.shape[0]
        self.x[:n].copy_(x, non_blocking=True)
        self.ids[:n].copy_(ids, non_blocking=True)
        self.weights[:n].copy_(weights, non_blocking=True)
        signal(self.flags, self.index, self.seq)
