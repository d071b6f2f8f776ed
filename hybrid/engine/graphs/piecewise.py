"""The "layers" form: each device piece of the DecoderProgram (the stretch between two MoE
layers' hand-overs) is a graph, and each host piece (the CPU experts) runs between two replays,
on the step's real rows only. Host work is never captured."""

from __future__ import annotations

import torch

from hybrid.engine.graphs.capture import captured
from hybrid.engine.step.decoder import DecoderProgram, StepState


class PiecewiseGraphs:
    def __init__(self, program: DecoderProgram) -> None:
        self.program = program

    def capture(self, state: StepState, pool) -> list[torch.cuda.CUDAGraph | None]:
        """-> a graph per device piece, None for host pieces (the kernels already compiled)."""
        graphs = []
        for piece in self.program.pieces:
            if not piece.on_device:
                graphs.append(None)
                continue
            g = torch.cuda.CUDAGraph()
            with captured(g, pool):
                piece.run(state)
            graphs.append(g)
        return graphs

    def replay(self, graphs: list, state: StepState, beside=None) -> None:
        """The pieces in order; `beside()` first (the host runs each layer's experts itself
        between the pieces: nothing to overlap on it)."""
        if beside is not None:
            beside()
        for piece, graph in zip(self.program.pieces, graphs):
            if graph is not None:
                graph.replay()
            else:
                piece.run(state)
