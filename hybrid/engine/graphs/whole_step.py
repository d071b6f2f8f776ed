"""The "step" form: the whole step is one graph (DecoderProgram.run_on_device: the GPU raises a
flag when a MoE layer's rows are in pinned memory and waits for the flag of the experts'
answer); the host launches it and then drives every layer's CPU experts from one call
(HostExperts) while it runs. Nothing is launched per layer and no host code runs between two
layers' experts but a spin on a flag. The graph ends with the rows' greedy picks
(device_picks.py), which a greedy step reads instead of sampling its logits.

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
from hybrid.engine.graphs.device_picks import DevicePicks, wait_for_flag
from hybrid.engine.graphs.static_step import StaticStep
from hybrid.engine.step.decoder import DecoderProgram
from hybrid.engine.step.host_experts import HostExperts
from hybrid.engine.step.step_state import StepState
from hybrid.errors import DeviceLost


class WholeStepGraphs:
    def __init__(self, program: DecoderProgram, device: torch.device, carried: torch.Tensor,
                 progress: Callable[[str], None] | None = None) -> None:
        """carried: [most rows a step has] int64, the runner's carried ids (the picks go
        there too)."""
        self.program, self.device = program, device
        program.bridge.use_flags(len(program.moe_layers))
        self.picks = DevicePicks(carried.numel(), carried, program.bridge)
        self._ready = program.bridge.ready.numpy()  # the layers' ready flags, read by started
        self.host = HostExperts(program.moe_layers, program.bridge)
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="hybrid-beside-step")
        if progress is not None:
            progress("compiling the CPU experts' step driver")
        self.host.warm_up()
        if progress is not None:
            progress(f"the CPU experts of a decode step: {self.host.describe()}")

    def capture(self, static: StaticStep, pools: dict) -> torch.cuda.CUDAGraph:
        """static: the bucket's StaticStep, whose staged rows the graph fetches first, with the
        step's sequence number (nothing is launched between staging them and the replay);
        pools: a graph memory pool per device (one here: the step runs on one GPU)."""
        state = static.state
        # flags and seq are all 0: the waits pass at once (this compiles the hand-over and
        # pick kernels outside the capture)
        self.picks.pick(self.program.run_on_device(state))
        torch.cuda.synchronize(self.device)
        g = torch.cuda.CUDAGraph()
        with captured(g, pools[self.device]):
            static.fetch()
            self.program.bridge.load_seq()
            self.picks.pick(self.program.run_on_device(state))
        return g

    def replay(self, graph: torch.cuda.CUDAGraph, state: StepState,
               beside: Callable[[], None] | None = None,
               before_experts: Callable[[], None] | None = None) -> None:
        """The step's graph (its rows staged by StaticStep.load), its CPU experts driven
        meanwhile on this thread (`launch`, then `drive`)."""
        self.drive(self.launch(graph), state, beside, before_experts)

    def launch(self, graph: torch.cuda.CUDAGraph) -> int:
        """The step's graph launched (its rows staged) -> its sequence number, for `drive`.
        Invariant: the step before was driven, or is past its first MoE layer (started)."""
        bridge = self.program.bridge
        if bridge.gave_up:
            raise DeviceLost(f"a CUDA graph stopped waiting for the CPU experts of MoE layer "
                             f"{bridge.gave_up - 1} (see the log for the failure before it); "
                             f"restart the server")
        seq = bridge.stage_seq()  # the graph loads it
        graph.replay()
        return seq

    def drive(self, seq: int, state: StepState, beside: Callable[[], None] | None = None,
              before_experts: Callable[[], None] | None = None) -> None:
        """Step `seq`'s CPU experts on this thread; `before_experts()` on this thread first
        (the GPU runs the step up to its first MoE layer meanwhile), `beside()` on another
        thread at the same time (under inference mode, on this device)."""
        if before_experts is not None:
            try:
                before_experts()
            except BaseException:
                self.host.run(seq, state.num_real)  # the launched graph waits on them
                raise
        if beside is None:
            self.host.run(seq, state.num_real)
            return
        self.host.prepare(seq, state.num_real)  # its GIL hand-offs before beside's thread runs
        launched = self._beside.submit(self._in_context, beside)
        try:
            self.host.run(seq, state.num_real)
        finally:
            launched.result()  # its launches done (or its error raised) before anything else

    def started(self, seq: int) -> None:
        """Return once step `seq` is past its first MoE layer's hand-over (it read its staged
        rows and sequence number: the next step's may be staged); raises DeviceLost after
        host_experts.TIMEOUT_S."""
        wait_for_flag(self._ready, 0, seq, "reach its first MoE layer")

    def _in_context(self, fn: Callable[[], None]) -> None:
        """fn() on a thread of its own with the caller's per-thread torch state, once the
        CPU experts' driver has started (HostExperts.wait_driving: first, before this thread
        runs Python that would hold the driver back)."""
        self.host.wait_driving()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        with torch.inference_mode():
            fn()
