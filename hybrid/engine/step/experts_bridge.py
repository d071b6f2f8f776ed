"""The hand-over of a MoE layer's routed experts from the model's device to the CPU and back.

Per MoE layer and step, exactly one device-to-host copy (the normalized hidden rows, the chosen
expert ids and their weights, into pinned buffers) and one host-to-device transfer (the
experts' weighted sum), both on the model's stream, and one host wait (an event recorded right
after the first copy). Between them the GPU runs the layer's shared expert while the CPU pool
runs the routed ones. Layers run one after another, so every layer shares one set of buffers.
The transfer back of a few rows (a decode step's) is a kernel reading the pinned buffer
(gpu_kernels/handshake.py's fetch), not a copy: a copy would queue behind a long prompt's
expert uploads on the host-to-device copy engine.

    send(h, ids, w)   GPU work: the three copies into pinned memory     (in a captured piece)
    mark()            host: record the event after them
    compute(op, n)    host: wait for the event, run the first n rows' experts on the CPU
                      (and, with expert deferral, the deferred ones after them)
    receive(n)        GPU work: the experts' sum back to the device      (in a captured piece)

On a CPU placement the buffers are plain host tensors and the event is skipped.

A decode step captured whole (one CUDA graph for all layers) replaces mark/compute with flags in
mapped pinned memory (gpu_kernels/handshake.py): `signal(l)` after the copies, the host side
(host_experts.py) waits for it, runs the experts and raises done[l], which `wait(l)` waits for
on the GPU before `receive`. Flags carry the step's sequence number (`stage_seq`, `load_seq`).
There the router's launch can do the copies and the signal itself (`handover(l)`), and the next
norm's launch the wait and the read (`awaited(l, n)`): each takes what four launches did.
"""

from __future__ import annotations

import torch

from cpu_kernels.runtime.deferral import Deferral

FETCH_ROWS = 64  # up to this many rows come back by a kernel's reads; more by a copy


class ExpertsBridge:
    def __init__(self, max_tokens: int, hidden: int, top_k: int, device: torch.device) -> None:
        self.device = device
        on_gpu = device.type == "cuda"

        def host(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, pin_memory=on_gpu)

        self.x = host(max_tokens, hidden)  # [T, H] normalized hidden rows
        self.ids = host(max_tokens, top_k, dtype=torch.int64)  # [T, K]
        self.weights = host(max_tokens, top_k)  # [T, K]
        self.out = host(max_tokens, hidden)  # [T, H] the routed experts' weighted sum
        routed = torch.zeros(max_tokens, hidden, device=device) if on_gpu else self.out
        if on_gpu:  # compiled now, not in the first request's step (receive's kernel)
            from gpu_kernels.handshake import fetch

            fetch(self.out[:1], routed[:1])
        # per GPU that hands over (a model over several adds its others: serve()): where the
        # experts' sum comes back [T, H], and the event recorded after the copies out
        self._routed = {device: routed}
        self._events = {device: torch.cuda.Event() if on_gpu else None}
        self._marked = self._events[device]  # the last mark's event, which compute waits for
        self._np = (self.x.numpy(), self.ids.numpy(), self.weights.numpy(), self.out.numpy())
        # expert deferral: a decode row's deferred experts' sum between layers (host arrays)
        self.deferral = Deferral(hidden, top_k)
        self.ready = self.done = self.error = self.seq = self._counter = None
        self._seq_host = self._seq_np = self._error_np = None
        self.step_seq = 0

    def serve(self, device: torch.device) -> None:
        """Hand over from and back to `device` as well (a layer range on another GPU): its own
        receive buffer and event, made now, not in a step (a capture may hold them)."""
        if device in self._routed or device.type != "cuda" or self.device.type != "cuda":
            return
        with torch.cuda.device(device):
            self._routed[device] = torch.zeros(self.out.shape, device=device)
            self._events[device] = torch.cuda.Event()
            from gpu_kernels.handshake import fetch

            fetch(self.out[:1], self._routed[device][:1])  # compiled for this GPU now

    def use_flags(self, num_layers: int) -> None:
        """Allocate the hand-over flags of `num_layers` MoE layers (a whole-step graph); once:
        graphs captured earlier keep pointing at them."""
        if self.ready is not None:
            if self.ready.numel() != num_layers:
                raise ValueError(f"flags for {self.ready.numel()} layers, not {num_layers}")
            return
        pin = self.device.type == "cuda"  # mapped: the GPU's kernels read and write them
        self.ready = torch.zeros(num_layers, dtype=torch.int64, pin_memory=pin)  # GPU -> CPU
        self.done = torch.zeros(num_layers, dtype=torch.int64, pin_memory=pin)  # CPU -> GPU
        self.error = torch.zeros(1, dtype=torch.int32, pin_memory=pin)  # a wait gave up
        self.seq = torch.zeros(1, dtype=torch.int64, device=self.device)
        # the programs of a router's launch that wrote their rows (handover): 0 between launches
        self._counter = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._seq_host = torch.zeros(1, dtype=torch.int64, pin_memory=pin)
        # numpy views: per step, a torch element read or write costs microseconds
        self._seq_np, self._error_np = self._seq_host.numpy(), self.error.numpy()
        if pin:  # its kernel compiled now, not in a capture or the first request's step
            self.load_seq()

    def handover(self, layer: int):
        """For a whole-step graph's router: where its launch writes MoE layer `layer`'s rows
        and choices (the pinned buffers of `send`), and the ready flag it then raises."""
        from gpu_kernels.handshake import Handover

        return Handover(self.x, self.ids, self.weights, self.ready, layer, self.seq,
                        self._counter)

    def awaited(self, layer: int, n: int, device: torch.device | None = None):
        """For a whole-step graph: the experts' sum of MoE layer `layer` for the first n rows
        as the host will have written it (done[layer] raised), for the kernel that adds it to
        wait for and read itself, or to `resolve()` into what `receive` returns."""
        from gpu_kernels.handshake import Awaited

        routed = self._routed.get(device, self._routed[self.device])
        src = self.out[:n]
        return Awaited(src, src if routed is self.out else routed[:n], self.done, layer,
                       self.seq, self.error)

    @property
    def gave_up(self) -> int:
        """1 + the MoE layer whose GPU wait stopped polling before its flag came, 0 while none
        did (set by the device, read here)."""
        return int(self._error_np[0])

    def stage_seq(self) -> int:
        """A new step's sequence number, written to pinned host memory only: a whole-step graph
        loads it onto the device itself (`load_seq`, its first work), so nothing is launched
        before the replay. Invariant: the graph that read the last one is past its first MoE
        layer (HostExperts.run answered its flags, which carry the number it read)."""
        self.step_seq += 1
        self._seq_np[0] = self.step_seq
        return self.step_seq

    def load_seq(self) -> None:
        """GPU work (captured): the sequence number `stage_seq` wrote, onto the device (a
        kernel reading pinned memory: a copy would queue on the copy engine behind a long
        prompt's expert uploads)."""
        from gpu_kernels.handshake import fetch

        fetch(self._seq_host, self.seq)

    def signal(self, layer: int) -> None:
        """GPU work: raise ready[layer] (after the copies of `send`, in stream order)."""
        from gpu_kernels.handshake import signal

        signal(self.ready, layer, self.seq)

    def wait(self, layer: int) -> None:
        """GPU work: hold the stream until the host raised done[layer] for this step."""
        from gpu_kernels.handshake import wait

        wait(self.done, layer, self.seq, self.error)

    @property
    def host_arrays(self) -> tuple:
        """(x [T, H], ids [T, K], weights [T, K], out [T, H]) as numpy views of the buffers."""
        return self._np

    @property
    def max_tokens(self) -> int:
        return self.x.shape[0]

    def send(self, h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
        """GPU work on h's device (a served one): the copies into the pinned buffers."""
        n = h.shape[0]
        # a copy from a GPU without an event of its own is waited for here, not by an event
        ours = h.device in self._events
        self.x[:n].copy_(h, non_blocking=ours)
        self.ids[:n].copy_(ids, non_blocking=ours)
        self.weights[:n].copy_(weights, non_blocking=ours)

    def mark(self, device: torch.device | None = None) -> None:
        """Host: record the event of `device` (the one send ran on; None: the bridge's) after
        the copies, on that device's current stream."""
        device = device if device is not None else self.device
        event = self._marked = self._events.get(device)
        if event is not None:
            event.record(torch.cuda.current_stream(device))

    def compute(self, experts, n: int, defer: int = 0, rows: int = 0, first: bool = True) -> None:
        """experts: the layer's ExpertsOp (runs_on_host). With expert deferral
        (cpu_kernels/runtime/deferral.py): `defer` experts of each of the rows :rows deferred to
        the next call (the step's next MoE layer); the previous call's deferred sum is added
        unless `first` (the step's first MoE layer)."""
        if self._marked is not None:
            self._marked.synchronize()
        x, ids, w, out = self._np
        if first:
            self.deferral.begin_step()
        self.deferral.now(experts.run_host, x[:n], ids[:n], w[:n], out[:n], defer, rows)
        self.deferral.later(experts.run_host)

    def receive(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """-> [n, H] f32 on `device` (a served one; None: the bridge's): the routed experts'
        output for this step's rows."""
        routed = self._routed.get(device, self._routed[self.device])
        if routed is not self.out:
            if n <= FETCH_ROWS:
                from gpu_kernels.handshake import fetch

                fetch(self.out[:n], routed[:n])
            else:
                routed[:n].copy_(self.out[:n], non_blocking=True)
        return routed[:n]
