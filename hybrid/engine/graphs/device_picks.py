"""Greedy tokens picked inside a whole-step graph: the graph's last kernel
(gpu_kernels/greedy_pick.py) writes each row's argmax and its log-probability into pinned host
memory and into the runner's carried ids, then raises a flag with the step's sequence number.

A step whose requests all decode greedily (no penalties, grammar, forced tokens or top
log-probabilities) then launches nothing after its graph to sample: the host polls one word
and reads its rows (`StepPicks.result`), and the next step's graph reads the tokens from the
carried ids. Other steps sample the graph's logits as eager steps do.

Invariant: one set of buffers serves every bucket and step. A step's picks are read before the
next step's graph writes them: that graph's pick kernel runs after its last MoE layer, which
waits for the host's experts, which the host drives only after reading (engine.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from gpu_kernels.greedy_pick import greedy_pick
from hybrid.engine.sampling.sampler import Sampled, reported
from hybrid.engine.step.experts_bridge import ExpertsBridge
from hybrid.engine.step.host_experts import TIMEOUT_S
from hybrid.errors import DeviceLost


class DevicePicks:
    def __init__(self, size: int, carried: torch.Tensor, bridge: ExpertsBridge) -> None:
        """size: the most rows a step picks; carried: [>= size] int64, the runner's carried
        ids on the device; bridge: whose `seq` (the step's number, loaded by the graph) the
        flag is raised with."""
        pin = carried.device.type == "cuda"  # mapped: the graph's kernel writes them
        self.carried, self.bridge = carried, bridge
        self.ids = torch.zeros(size, dtype=torch.int64, pin_memory=pin)  # [size]
        self.logprobs = torch.zeros(size, dtype=torch.float32, pin_memory=pin)  # [size]
        self.flag = torch.zeros(1, dtype=torch.int64, pin_memory=pin)
        self.counter = torch.zeros(1, dtype=torch.int32, device=carried.device)
        self._np = (self.ids.numpy(), self.logprobs.numpy(), self.flag.numpy())

    def pick(self, logits: torch.Tensor) -> None:
        """GPU work (captured after the step's head): logits [B, V] f32 -> the picks of its
        B rows, then the flag."""
        greedy_pick(logits, self.carried, self.ids, self.logprobs,
                    (self.flag, 0, self.bridge.seq, self.counter))

    def of_step(self, seq: int, rows: list[int]) -> StepPicks:
        """The picks of step `seq` for `rows` (of its graph's rows), to read once it ends."""
        return StepPicks(self._np, seq, rows)


@dataclass(frozen=True)
class StepPicks:
    """One step's greedy picks of some rows, readable once the graph raised its flag."""

    arrays: tuple[np.ndarray, np.ndarray, np.ndarray]  # ids, logprobs, flag (pinned views)
    seq: int
    rows: list[int]  # graph rows, one a request (the carried ids' rows too)

    def select(self, rows: list[int]) -> StepPicks:
        """The picks of rows[i] of this one's, for each i."""
        return StepPicks(self.arrays, self.seq, [self.rows[i] for i in rows])

    def result(self) -> list[Sampled]:
        """Wait for the step's flag (the GPU's last kernel of the step), then read the rows."""
        ids, logprobs, flag = self.arrays
        wait_for_flag(flag, 0, self.seq, "finish after its last MoE layer")
        return [Sampled(int(ids[r]), reported(float(logprobs[r])), ()) for r in self.rows]


def wait_for_flag(flags: np.ndarray, index: int, seq: int, what: str) -> None:
    """Spin until flags[index] == seq (a word the GPU raises in mapped pinned memory, steps in
    increasing order); after TIMEOUT_S the GPU is taken for lost: DeviceLost says the decode
    step's graph did not `what`. A flag already past seq raises at once: a later step ended
    first, so this one's (its buffers rewritten since) can never be read."""
    if flags[index] == seq:
        return
    deadline = time.monotonic() + TIMEOUT_S
    while flags[index] != seq:
        if flags[index] > seq:
            raise DeviceLost(f"a decode step's graph was overtaken by step {int(flags[index])} "
                             f"before step {seq} could be read (see the log); restart the server")
        if time.monotonic() > deadline:
            raise DeviceLost(f"a decode step's graph did not {what} within {TIMEOUT_S:.0f} s "
                             f"(step {seq} awaited, the flag holds step {int(flags[index])}); "
                             f"the CUDA device may have failed (see the log), restart the server")
