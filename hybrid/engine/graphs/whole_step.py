"""The "step" form: the whole step is one graph (DecoderProgram.run_on_device: the GPU raises a
flag when a MoE layer's rows are in pinned memory and waits for the flag of the experts'
answer); the host launches it and then drives every layer's CPU experts from one call
(HostExperts) while it runs. Nothing is launched per layer and no host code runs between two
layers' experts but a spin on a flag."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybrid.engine.step.decoder import DecoderProgram, StepState
from hybrid.engine.step.host_experts import HostExperts
from hybrid.errors import DeviceLost


class WholeStepGraphs:
    def __init__(self, program: DecoderProgram, device: torch.device,
                 progress: Callable[[str], None] | None = None) -> None:
        self.program, self.device = program, device
        program.bridge.use_flags(len(program.moe_layers))
        self.host = HostExperts(program.moe_layers, program.bridge)
        if progress is not None:
            progress("compiling the CPU experts' step driver")
        self.host.warm_up()

    def capture(self, state: StepState, pool) -> torch.cuda.CUDAGraph:
        # flags and seq are all 0: the waits pass at once (this compiles the hand-over kernels
        # outside the capture)
        self.program.run_on_device(state)
        torch.cuda.synchronize(self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            self.program.run_on_device(state)
        return g

    def replay(self, graph: torch.cuda.CUDAGraph, state: StepState) -> None:
        bridge = self.program.bridge
        if bridge.gave_up:
            raise DeviceLost("a CUDA graph stopped waiting for the CPU experts (see the log "
                             "for the failure before it); restart the server")
        seq = bridge.next_seq()  # before the replay, on its stream
        graph.replay()
        self.host.run(seq, state.num_real)
