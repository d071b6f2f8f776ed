"""What flows through one engine step's pieces (`StepState`), and a piece itself (`Piece`):
the step program (decoder.py) is a list of pieces, device work and the host work between."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hybrid.engine.step.forward_batch import ForwardBatch


@dataclass
class StepState:
    """What flows between a step's pieces. `pending`: outputs not yet added to the residual
    stream `x` (the next norm adds them)."""

    fb: ForwardBatch
    num_real: int  # rows that are real tokens (a CUDA graph's batch is padded)
    residual: torch.Tensor | None = None  # [N, H] f32 residual stream
    normed: torch.Tensor | None = None  # [N, H] the normalized rows the MoE layer works on
    # `normed` quantized for the shared expert's integer path (XQ), or None
    normed_q: tuple | None = None
    pending: list[torch.Tensor] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [R, V]
    # MoE layers (indices into DecoderProgram.moe_layers) whose experts this step streams to
    # the device (expert_stream.py; eager steps only), and the current one's output [N, H]
    streamed: frozenset[int] = frozenset()
    routed: torch.Tensor | None = None
    # the current layer's hand-off to its GPU-held experts (experts op, ids, held weights),
    # run beside the shared expert once the host has its rows; then their output [N, H]
    held: tuple | None = None
    held_out: torch.Tensor | None = None
    # start-up only: every bridged layer's routed experts left out (their output zeros), so the
    # step compiles its device kernels while the CPU experts' kernels still compile elsewhere
    routed_off: bool = False
    # a captured step's crossings to another GPU (StaticStep sets {}): per crossing, the tensors
    # it copies and the ones it copies into, kept so that replays copy between the same memory
    # (the graphs on both sides read and write those); None: an eager step moves what it holds
    crossings: dict | None = None
    replaying: bool = False  # graphs replay: `residual` and `pending` are stale Python names
    # run_on_device (a whole-step graph's capture): the hand-overs are flags, and the kernels
    # on either side of one may take its copies, flag and wait into their own launches;
    # `signaled`: the current layer's router launch raised its ready flag itself
    handshake: bool = False
    signaled: bool = False

    def on_host(self, i: int) -> bool:
        """Whether MoE layer i's routed experts run on the host this step."""
        return not self.routed_off and i not in self.streamed


@dataclass(frozen=True)
class Piece:
    on_device: bool  # device work (capturable) or host work
    run: Callable[[StepState], None]
    twin: Callable[[StepState], None] | None = None  # a host piece's device-side stand-in
    # device work: the one device all of it runs on (None: several, or not known; such a
    # piece is not captured per device)
    device: torch.device | None = None
    # host work that moves the step to the next piece's GPU first (a model over several GPUs):
    # a graph capture runs it alone (it is part of `run`, which the capture skips)
    cross: Callable[[StepState], None] | None = None
