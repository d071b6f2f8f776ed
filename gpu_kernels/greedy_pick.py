"""Greedy picks inside a step's CUDA graph: each row's argmax and its log-probability, written
where the next step and the host read them, so that no launch follows the graph to sample.

    greedy_pick(logits [R, V] f32, carried [>= R] int64 (device),
                ids [>= R] int64, logprobs [>= R] f32 (pinned host memory, mapped),
                flag=(flags, index, seq, counter) or None)

Row r's pick is the lowest id of its largest logit (torch.argmax's), and its log-probability
the logit minus the row's logsumexp, computed in one pass of running max and rescaled sum over
blocks of the row. carried[r] = ids[r] = the pick (carried: the next decode step's input on the
device), logprobs[r] = its log-probability. With `flag`, the launch's last program to finish
raises flags[index] = seq (handshake.raise_flag) once every row is written, so the host polls
one word instead of waiting on an event (recording one is a launch too).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.handshake import raise_flag

PICK_BLOCK = 2048  # columns of a row read per step


@triton.jit
def _greedy_pick_kernel(logit_ptr, V, stride, carried_ptr, id_ptr, lp_ptr,
                        fl_ptr, fl_index, seq_ptr, cnt_ptr, BLOCK: tl.constexpr,
                        SIGNAL: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    row = logit_ptr + r * stride
    cols = tl.arange(0, BLOCK)
    first = tl.load(row + cols, mask=cols < V, other=float("-inf"))
    best = tl.max(first, axis=0)  # finite from the start: no rescale by exp(-inf + inf)
    best_at = tl.argmax(first, axis=0, tie_break_left=True).to(tl.int64)
    total = tl.zeros((), tl.float32)  # sum of exp(x - best) so far
    for c0 in range(0, V, BLOCK):
        c = c0 + cols
        x = tl.load(row + c, mask=c < V, other=float("-inf"))
        block_best = tl.max(x, axis=0)
        block_at = tl.argmax(x, axis=0, tie_break_left=True)
        new_best = tl.maximum(best, block_best)
        total = total * tl.exp(best - new_best) + tl.sum(tl.exp(x - new_best), axis=0)
        # strictly larger: the first block holding the row's largest logit keeps it
        best_at = tl.where(block_best > best, c0 + block_at.to(tl.int64), best_at)
        best = new_best
    tl.store(carried_ptr + r, best_at)
    tl.store(id_ptr + r, best_at)
    tl.store(lp_ptr + r, -tl.log(total))  # best - (best + log(total))
    if SIGNAL:
        tl.debug_barrier()  # the program's stores before its count (then the flag)
        if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.store(cnt_ptr, 0)  # the last one: every row is written
            raise_flag(fl_ptr, fl_index, seq_ptr)


def greedy_pick(logits: torch.Tensor, carried: torch.Tensor, ids: torch.Tensor,
                logprobs: torch.Tensor,
                flag: tuple[torch.Tensor, int, torch.Tensor, torch.Tensor] | None = None
                ) -> None:
    """logits: [R, V] f32 (rows may be strided); carried [>= R] int64 on its device; ids
    [>= R] int64 and logprobs [>= R] f32 that the device writes (pinned host memory on a GPU);
    flag: (flags [L] int64 mapped pinned, index, seq [1] int64 device, counter [1] int32 device,
    0 between launches), raised once every row is written."""
    r, v = logits.shape
    if logits.dtype != torch.float32 or logits.stride(1) != 1 or carried.numel() < r \
            or ids.numel() < r or logprobs.numel() < r or carried.dtype != torch.int64 \
            or ids.dtype != torch.int64 or logprobs.dtype != torch.float32 or v < 1:
        raise ValueError(f"greedy_pick: logits {logits.dtype}{tuple(logits.shape)} into "
                         f"carried {carried.dtype}[{carried.numel()}], ids "
                         f"{ids.dtype}[{ids.numel()}], logprobs "
                         f"{logprobs.dtype}[{logprobs.numel()}]")
    if flag is None:
        flags, index, seq, counter = logits, 0, logits, logits  # not read
    else:
        flags, index, seq, counter = flag
    if r:
        _greedy_pick_kernel[(r,)](logits, v, logits.stride(0), carried, ids, logprobs, flags,
                                  index, seq, counter, BLOCK=PICK_BLOCK,
                                  SIGNAL=flag is not None, num_warps=8)


def greedy_pick_ref(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] -> (ids [R] int64, log-probabilities [R] f32 of those ids), in float64."""
    x = logits.double()
    ids = x.argmax(dim=-1)
    lp = x.gather(1, ids[:, None])[:, 0] - torch.logsumexp(x, dim=-1)
    return ids, lp.float()
