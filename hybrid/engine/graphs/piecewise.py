"""The "layers" form: each device piece of the DecoderProgram (the stretch between two MoE
layers' hand-overs) is a graph, and each host piece (the CPU experts) runs between two replays,
on the step's real rows only. Host work is never captured.

A model over several GPUs takes this form: each piece is captured on its own GPU (into that
GPU's pool) and replays on that GPU's current stream; a host piece's `cross` moves the step to
the next piece's GPU between two replays (it runs at capture too: the next graph reads what it
wrote)."""

from __future__ import annotations

import torch

from hybrid.engine.graphs.capture import captured
from hybrid.engine.graphs.static_step import StaticStep
from hybrid.engine.step.decoder import DecoderProgram
from hybrid.engine.step.step_state import StepState


class PiecewiseGraphs:
    def __init__(self, program: DecoderProgram) -> None:
        self.program = program
        self._streams: dict = {}  # a capture stream per GPU (a model over several)

    def capture(self, static: StaticStep, pools: dict) -> list[torch.cuda.CUDAGraph | None]:
        """static: the bucket's StaticStep (its state; its rows are fetched by its load, before
        the replays); pools: a graph memory pool per device -> a graph per device piece, None
        for host pieces (the kernels already compiled)."""
        state = static.state
        spread = len(pools) > 1  # each GPU's pieces captured with it current, on its stream
        graphs = []
        for piece in self.program.pieces:
            if not piece.on_device:
                if piece.cross is not None:
                    piece.cross(state)
                graphs.append(None)
                continue
            with torch.cuda.device(piece.device if spread else None):
                if spread and piece.device not in self._streams:
                    self._streams[piece.device] = torch.cuda.Stream()
                g = torch.cuda.CUDAGraph()
                with captured(g, pools[piece.device], self._streams.get(piece.device)):
                    piece.run(state)
            graphs.append(g)
        state.replaying = True  # from now on its pieces' tensors are the graphs'
        return graphs

    def replay(self, graphs: list, state: StepState, beside=None, before_experts=None) -> None:
        """The pieces in order; `beside()` and `before_experts()` first (the host runs each
        layer's experts itself between the pieces: nothing to overlap on it)."""
        for first in (beside, before_experts):
            if first is not None:
                first()
        for piece, graph in zip(self.program.pieces, graphs):
            if graph is not None:
                graph.replay()
            else:
                piece.run(state)
