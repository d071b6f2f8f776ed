"""The "step" form: the whole step is one graph (DecoderProgram.run_on_device: the GPU raises a
flag when a MoE layer's rows are in pinned memory and waits for the flag of the experts'
answer); the host launches it and then drives every layer's CPU experts from one call
(HostExperts) while it runs. Nothing is launched per layer and no host code runs between two
layers' experts but a spin on a flag.

The step is captured as two graphs: `first`, the staged rows and sequence number fetched onto
the device and the work up to the first MoE layer's hand-over (a few dozen nodes), and `rest`.
Launching a graph costs the host time in proportion to its nodes (hundreds of microseconds for
the rest of a V2-Lite step), before which the GPU starts nothing: the caller launches `first`,
hands the launch of `rest` to the thread below, and drives the CPU experts at once, so the
first layer's experts start while `rest` is still being launched (its first node waits for
their answer anyway).

Work `beside` the step (a prompt's layers launched on a stream of their own) runs on a thread
of this object's while the calling thread drives the CPU experts: the driver is numba without
the GIL, so the launches and the experts run at once instead of one after the other. The
experts stay on the thread that warmed them up (a numba/OpenMP team belongs to the thread that
starts it: another thread would start a second team of spinning threads). Invariant: a replay
returns only after both finished, whatever either raised."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from hybrid.engine.graphs.capture import captured
from hybrid.engine.graphs.launch import launch
from hybrid.engine.step.decoder import DecoderProgram, StepState
from hybrid.engine.step.host_experts import HostExperts
from hybrid.errors import DeviceLost

# the pieces `first` captures: the work up to the first MoE layer's router, and its hand-over
FIRST_PIECES = 2


class WholeStepGraphs:
    def __init__(self, program: DecoderProgram, device: torch.device,
                 progress: Callable[[str], None] | None = None) -> None:
        self.program, self.device = program, device
        program.bridge.use_flags(len(program.moe_layers))
        self.host = HostExperts(program.moe_layers, program.bridge)
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="hybrid-beside-step")
        if progress is not None:
            progress("compiling the CPU experts' step driver")
        self.host.warm_up()
        if progress is not None:
            progress(f"the CPU experts of a decode step: {self.host.describe()}")

    def capture(self, state: StepState, pools: dict, static
                ) -> tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]:
        """pools: a graph memory pool per device (one here: the step runs on one GPU); static:
        the bucket's StaticStep, whose staged rows `first` fetches. -> (first, rest)."""
        bridge = self.program.bridge
        # flags and seq are all 0: the waits pass at once (this compiles the hand-over kernels
        # outside the capture)
        self.program.run_on_device(state)
        torch.cuda.synchronize(self.device)
        first, rest = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with captured(first, pools[self.device]):
            static.fetch()
            bridge.load_seq()
            self.program.run_on_device(state, 0, FIRST_PIECES)
        with captured(rest, pools[self.device]):
            self.program.run_on_device(state, FIRST_PIECES)
        return first, rest

    def replay(self, graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph],
               state: StepState, beside: Callable[[], None] | None = None) -> None:
        """The step's graphs (the rows staged by StaticStep.load), its CPU experts driven
        meanwhile on this thread; the launch of `rest`, then `beside()`, on another thread at
        the same time (under inference mode, on this device and stream)."""
        bridge = self.program.bridge
        if bridge.gave_up:
            raise DeviceLost(f"a CUDA graph stopped waiting for the CPU experts of MoE layer "
                             f"{bridge.gave_up - 1} (see the log for the failure before it); "
                             f"restart the server")
        first, rest = graphs
        seq = bridge.stage_seq()  # `first` loads it
        first.replay()
        launched = self._beside.submit(self._in_context, torch.cuda.current_stream(self.device)
                                       if self.device.type == "cuda" else None, rest, beside)
        try:
            self.host.run(seq, state.num_real)
        finally:
            launched.result()  # its launches done (or its error raised) before anything else

    def _in_context(self, stream, rest, beside: Callable[[], None] | None) -> None:
        """`rest` launched on the caller's stream, then beside(), on a thread of its own with
        the caller's per-thread torch state."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        launch(rest, stream)  # without the GIL: the caller enters the driver meanwhile
        if beside is not None:
            with torch.inference_mode():
                beside()
