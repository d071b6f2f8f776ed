"""The model's forward over one engine step, as a list of pieces: device work, and the host
work between (the CPU experts of each MoE layer).

    [embed, layers .. first MoE layer's router, send]  device
    [mark]                                              host: event after the copies
    [shared expert]                                     device, overlaps the CPU experts
    [compute]                                           host: the routed experts on the CPU
    [receive, next layers .. next router, send]         device
    ...
    [receive, final norm, head on the sampled rows]     device

Eagerly the pieces simply run in order (any batch: prefill chunks and decodes); for decode
batches each device piece is captured as a CUDA graph and replayed (graphs/), the host
pieces run between; or the whole step is one graph (`run_on_device`): each host piece has a
device twin (raise the layer's ready flag / wait for its done flag) and the host runs every
layer's experts from one call meanwhile (host_experts.py). The hidden state stays on the
device for the whole step; each layer's residual add is fused into the next RMSNorm
(RMSNormOp.add_norm).

A long prompt's step may stream some bridged layers' experts to the device instead
(`StepState.streamed`, expert_stream.py): their rows never leave the device and their host
pieces do nothing.

With expert deferral (the experts' `defer_experts`) a decode row's lowest-weighted experts of a
bridged layer join the next bridged layer's routed output (cpu_kernels/runtime/deferral.py):
the host pieces carry that sum, and in a whole-step graph the host computes it while the GPU
runs the next layer. A step that streams experts defers nothing.

A layer whose CPU experts share it with GPU-held "hot" experts (`gpu_experts`) is bridged too:
the held experts' slots go to the host as -1 (never read there) and the held experts run on
the GPU meanwhile, launched with the shared expert after the hand-over (the host's event, or
the ready flag, marks the copies alone), their output added with the host's; no host sync, so
it stays capturable.
Layers whose experts run elsewhere are run in place, as transformers' MoE block. Wholly on a
GPU in gpu_kernels' grouped launches (`ExpertsOp.device_only`) that block is device work without
a host sync and stays in the captured step; the torch loops (types gpu_kernels lacks) keep the
step eager (`can_capture` is false).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from hybrid.engine.step.device_span import cross_to, device_of, guarded, resolve
from hybrid.engine.step.experts_bridge import FETCH_ROWS, ExpertsBridge
from hybrid.engine.step.step_state import Piece, StepState
from hybrid.ops.experts import ExpertsOp
from hybrid.ops.kernel_sets.torch_set import resolved
from hybrid.ops.layers import RMSNormOp

# a bridged MoE layer's pieces: its mark, shared expert, routed experts (compute), then the
# receive and everything up to the next layer's hand-over (or the head)
PIECES_PER_MOE_LAYER = 4


class DecoderProgram:
    def __init__(self, model: nn.Module, bridge: ExpertsBridge) -> None:
        self.model = model
        self.inner = model.model
        self.bridge = bridge
        self.moe_layers: list[ExpertsOp] = []  # bridged layers' experts, in order
        self.stream = None  # an ExpertStream over moe_layers (set by the model runner)
        self.recorder = None  # a RoutingRecorder (set by the model runner) counts expert choices
        self.devices: list[torch.device] = []  # the devices of the device work, in step order
        self._receive_on: list[torch.device] = []  # per bridged layer, where its answer goes
        self.pieces = self._plan()
        for device in self.devices:  # every GPU that receives the CPU experts' output
            bridge.serve(device)
        self.can_capture = all(not _is_moe(layer.mlp) or _bridged(layer.mlp)
                               or _device_only(layer.mlp) for layer in self.inner.layers)

    @property
    def spans_devices(self) -> bool:
        """The model's device work runs on more than one device (layer ranges over GPUs)."""
        return len(self.devices) > 1

    @property
    def pieces_on_one_device(self) -> bool:
        """Every device piece runs on one device, so each can be captured on its own GPU (the
        moves between GPUs are host pieces' `cross`)."""
        return all(p.device is not None for p in self.pieces if p.on_device)

    def run(self, st: StepState) -> torch.Tensor:
        for piece in self.pieces:
            piece.run(st)
        return st.logits

    @property
    def num_pieces(self) -> int:
        return len(self.pieces)

    def after_layer(self, i: int) -> int:
        """The stop (for run_pieces) at which MoE layer i is passed: its experts' output
        received and the next layer's attention and router run (for the last: the head)."""
        return 1 + PIECES_PER_MOE_LAYER * (i + 1)

    @staticmethod
    def layers_passed(pieces_run: int) -> int:
        """MoE layers passed once the first `pieces_run` pieces ran."""
        return max(0, pieces_run - 1) // PIECES_PER_MOE_LAYER

    def run_pieces(self, st: StepState, start: int, stop: int) -> torch.Tensor | None:
        """Run pieces [start, stop) of the step: a pass spread over several calls. Piece 0 is
        all before the first MoE layer's hand-over (the embedding, dense layers, that layer's
        attention and router); MoE layer i then owns the pieces up to `after_layer(i)`: its
        mark, shared expert and routed experts, then the next layer's attention and router (the
        last one's: the final norm and head). With stop == num_pieces -> logits, else None."""
        for piece in self.pieces[start:stop]:
            piece.run(st)
        return st.logits if stop == len(self.pieces) else None

    def run_on_device(self, st: StepState) -> torch.Tensor:
        """The step as device work only (to capture whole): host pieces become their twins,
        so the CPU experts must be driven by someone else (HostExperts) meanwhile."""
        st.handshake = True
        for piece in self.pieces:
            (piece.run if piece.on_device else piece.twin)(st)
        return st.logits

    def _plan(self) -> list[Piece]:
        # the device work between two hand-overs, as (device, step) pairs (a device of None:
        # the next step's), and each bridged layer's (index, experts' block, its norm's device)
        stretches: list[list] = [[(device_of(self.inner.embed_tokens), self._embed)]]
        bridged = []
        for layer in self.inner.layers:
            stretch = stretches[-1]
            stretch.append((device_of(layer.self_attn), partial(self._attention, layer)))
            here = device_of(layer.post_attention_layernorm) or device_of(layer.self_attn)
            # a layer whose operators (its router, held or in-place experts, ...) sit on more
            # than one device mixes its stretch: no graph can capture it (markers: no step)
            stretch += [(d, None) for d in _layer_devices(layer) - {here}]
            if _is_moe(layer.mlp) and _bridged(layer.mlp):
                i = len(self.moe_layers)
                stretch.append((here, partial(self._route_and_send, layer, i)))
                self.moe_layers.append(layer.mlp.experts)
                bridged.append((i, layer.mlp, here))
                stretches.append([(None, None)])  # its receive, bound below to its device
            else:
                stretch.append((here, partial(self._mlp, layer)))
        stretches[-1] += [(device_of(self.inner.norm), None),  # the head's norm: a marker
                          (device_of(self.model.lm_head), self._head)]
        for i, stretch in enumerate(stretches):
            resolve(stretch)
            if i:  # the receive of bridged layer i - 1, on the device of what follows it
                stretch[0] = (stretch[0][0], partial(self._receive, i - 1, stretch[0][0]))
            for d, _ in stretch:
                if d not in self.devices:
                    self.devices.append(d)
        guard = self.spans_devices  # kernels launch on the current device: set it per step
        pieces = [_device_piece(stretches[0], guard)]
        for (i, mlp, here), stretch in zip(bridged, stretches[1:]):
            shared = getattr(mlp, "shared_experts", None)
            shared_on = (device_of(shared) or here) if shared is not None else here
            to = stretch[0][0]  # where the next piece runs (its receive's device)
            cross = partial(cross_to, i, to) if {here, shared_on} != {to} else None
            # GPU-held experts on another GPU mix the shared expert's piece (never captured)
            held_on = mlp.experts.held_device
            mixed = [(held_on, None)] if held_on not in (None, shared_on) else []
            self._receive_on.append(to)
            pieces += [Piece(False, partial(self._mark, i, here), partial(self._signal, i)),
                       _device_piece([(shared_on, partial(self._shared, mlp))] + mixed, guard),
                       Piece(False, partial(self._experts, mlp.experts, i, cross),
                             partial(self._wait, i), cross=cross),
                       _device_piece(stretch, guard)]
        return pieces

    # -- device work ------------------------------------------------------------------------

    def _embed(self, st: StepState) -> None:
        st.residual = self.inner.embed_tokens(st.fb.input_ids).float()  # [N, H]
        st.pending = []

    def _norm(self, norm: nn.Module, st: StepState, consumer: nn.Module | None = None):
        """-> (normed rows, the same quantized for `consumer`'s first product or None)."""
        device = getattr(norm, "device", st.residual.device)
        if st.residual.device != device:  # a layer on another GPU: the residual stream moves once
            st.residual = st.residual.to(device)
            st.pending = [resolved(d).to(device) for d in st.pending]
        bits = _input_bits(consumer, st.residual.shape[0], device)
        if isinstance(norm, RMSNormOp):  # its kernels wait for an Awaited delta themselves
            h, hq = norm.add_norm(st.residual, *st.pending, x_bits=bits)
        else:
            for d in st.pending:
                st.residual += resolved(d).to(st.residual.device)
            h, hq = norm(st.residual), None
        st.pending = []
        return h, hq

    def _attention(self, layer: nn.Module, st: StepState) -> None:
        h, hq = self._norm(layer.input_layernorm, st, layer.self_attn)
        st.pending = [layer.self_attn.step(h, st.fb, hq)]

    def _mlp(self, layer: nn.Module, st: StepState) -> None:
        if self.recorder is not None:  # a MoE block run in place records through its gate
            self.recorder.current = st.fb
        h, hq = self._norm(layer.post_attention_layernorm, st, layer.mlp)
        st.pending = [layer.mlp(h) if hq is None else layer.mlp(h, hq)]

    def _route_and_send(self, layer: nn.Module, i: int, st: StepState) -> None:
        shared = getattr(layer.mlp, "shared_experts", None)
        st.normed, st.normed_q = self._norm(layer.post_attention_layernorm, st, shared)
        gate = layer.mlp.gate  # it takes the rows to its device
        experts = layer.mlp.experts
        st.signaled = False
        if gate.device == st.normed.device:
            # a whole step's router sends the rows and raises the flag from its own launch
            # (unless GPU-held experts take pairs: those change the ids the host gets)
            send = self.bridge.handover(i) if st.handshake and st.on_host(i) \
                and not experts.splits(st.normed.shape[0]) \
                and gate.kernels.sends_from_router else None
            _, weights, ids = gate.route(st.normed, send)
            st.signaled = send is not None
        else:  # a router on another device (an eager step's): its kernels launch there
            with torch.cuda.device(gate.device if gate.device.type == "cuda" else None):
                _, weights, ids = gate.route(st.normed)
        if self.recorder is not None:
            self.recorder.add(gate.layer_index, ids, st.fb)
        if st.routed_off:
            st.routed = torch.zeros(st.normed.shape, dtype=torch.float32,
                                    device=st.normed.device)  # [N, H] as receive gives it
            return
        if i in st.streamed:  # the experts come to the rows: nothing crosses to the host
            st.routed = self._streamed(i, st.normed, ids, weights)
            return
        host_ids, held_weights = experts.hand_off(ids, weights)
        if not st.signaled:
            self.bridge.send(st.normed, host_ids, weights)
        # hot experts: on the GPU while the host runs the rest, so launched after the host's
        # mark (or the ready flag) that follows the copies, with the shared expert (_shared)
        st.held = None if held_weights is None else (experts, ids, held_weights)

    def _streamed(self, i: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
                  ) -> torch.Tensor:
        """MoE layer i's experts streamed to the stream's GPU -> [N, H] f32 on x's device. A
        layer on another GPU sends its rows there and back: an eager prompt step's megabytes
        beside the gigabytes of experts streamed."""
        device = self.stream.device
        if x.device == device:
            return self.stream.run(i, x, ids, weights)
        with torch.cuda.device(device):
            out = self.stream.run(i, x.to(device), ids.to(device), weights.to(device))
        return out.to(x.device)

    def _shared(self, mlp: nn.Module, st: StepState) -> None:
        """The shared expert and the GPU-held routed experts: device work after the host got
        the layer's rows, so the CPU experts never wait for it."""
        shared = getattr(mlp, "shared_experts", None)
        if shared is None:
            st.pending = []
        else:
            st.pending = [shared(st.normed) if st.normed_q is None else shared(st.normed, st.normed_q)]
        if st.held is not None:
            experts, ids, held_weights = st.held
            st.held_out = experts.run_held(st.normed, ids, held_weights)
            st.held = None

    def _receive(self, i: int, device: torch.device, st: StepState) -> None:
        n = st.residual.shape[0]
        if self._awaits(i, st):  # the next norm's launch waits for it and reads it
            routed = self.bridge.awaited(i, n, device)
        else:
            routed = self.bridge.receive(n, device) if st.on_host(i) else st.routed
        st.pending.append(routed)
        if st.held_out is not None:
            st.pending.append(st.held_out)
        st.routed = st.held_out = None

    def _head(self, st: StepState) -> None:
        rows = st.fb.on(st.residual.device).sample_rows  # moved once a step and device
        if rows.numel() == 0:  # only mid-prompt chunks this step
            st.logits = st.residual.new_empty(0, self.model.config.vocab_size)
            return
        x = st.residual[rows]  # [R, H]: only the rows that sample reach the head
        for d in st.pending:
            x += resolved(d).to(x.device)[rows]
        h = self.inner.norm(x) if not isinstance(self.inner.norm, RMSNormOp) \
            else self.inner.norm.add_norm(x)[0]
        st.logits = self.model.lm_head(h)  # [R, V]

    # -- a whole step's hand-overs (the host pieces' twins) -----------------------------------

    def _signal(self, i: int, st: StepState) -> None:
        """The ready flag of MoE layer i, unless its router's launch raised it."""
        if not st.signaled:
            self.bridge.signal(i)
        st.signaled = False

    def _wait(self, i: int, st: StepState) -> None:
        """Hold the GPU for MoE layer i's answer, unless the kernel that adds it waits."""
        if not self._awaits(i, st):
            self.bridge.wait(i)

    def _awaits(self, i: int, st: StepState) -> bool:
        """Whether MoE layer i's answer goes on as an Awaited (the kernel adding it waits for
        its flag): in a whole step, back to the bridge's GPU, few rows (read by kernels)."""
        return st.handshake and st.on_host(i) and self._receive_on[i] == self.bridge.device \
            and st.residual.shape[0] <= FETCH_ROWS

    # -- host work --------------------------------------------------------------------------

    def _mark(self, i: int, device: torch.device, st: StepState) -> None:
        if st.on_host(i):
            self.bridge.mark(device)

    def _experts(self, experts: ExpertsOp, i: int, cross, st: StepState) -> None:
        if cross is not None:  # queued first: the GPUs copy while the CPU computes
            cross(st)
        if not st.on_host(i):
            return
        # expert deferral carries a sum from one bridged layer to the next: not in a step that
        # streams some layers' experts (a long prompt's), nor from the last layer
        defers = not st.streamed and i + 1 < len(self.moe_layers)
        self.bridge.compute(experts, st.num_real, experts.defer_experts if defers else 0,
                            st.fb.num_decodes, first=i == 0 or bool(st.streamed))


def _device_piece(steps: list[tuple[torch.device, Callable[[StepState], None]]],
                  guard: bool) -> Piece:
    run_steps, device = guarded(steps, guard)

    def run(st: StepState) -> None:
        for step in run_steps:
            step(st)
    return Piece(True, run, device=device)


def _layer_devices(layer: nn.Module) -> set[torch.device]:
    """The devices of a layer's operators, the experts' held set included and the CPU
    experts that the hand-over serves left out."""
    out = set()
    for module in layer.modules():
        if not type(module).__module__.startswith("hybrid.ops"):
            continue
        if isinstance(module, ExpertsOp):
            if module.held_device is not None:
                out.add(module.held_device)
            if not module.runs_on_host and (d := device_of(module)) is not None:
                out.add(d)
        elif (d := device_of(module)) is not None:
            out.add(d)
    return out


def _input_bits(consumer: nn.Module | None, tokens: int, device: torch.device) -> int:
    """The bits `consumer` (an operator with `input_bits`, on the norm's device) takes its
    input quantized to for `tokens` rows: the norm then writes them in the same launch."""
    if consumer is None or not hasattr(consumer, "input_bits") \
            or getattr(consumer, "device", None) != device:
        return 0
    return consumer.input_bits(tokens)


def _is_moe(mlp: nn.Module) -> bool:
    return hasattr(mlp, "experts") and hasattr(mlp, "gate")


def _device_only(mlp: nn.Module) -> bool:
    """A MoE block run in place whose router and experts are device ops only (capturable)."""
    return isinstance(mlp.experts, ExpertsOp) and mlp.experts.device_only \
        and hasattr(mlp.gate, "route")


def _bridged(mlp: nn.Module) -> bool:
    experts = mlp.experts
    return isinstance(experts, ExpertsOp) and experts.runs_on_host \
        and hasattr(mlp.gate, "route")
