"""Which experts the routers choose: counts per MoE layer and expert, prompt tokens and decode
tokens apart, kept on the router's device.

Recording is a few tensor ops per MoE layer on the ids the router already made (an index_add
into a [2, L, E] table), with no host round trip, so it runs inside captured CUDA graphs and is
cheap enough to leave on (`hybrid serve --record-routing`). Rows are told apart by the step's
layout: the first `num_decodes` rows are decode tokens (one per running request), the rest are
prompt tokens; a padded decode row of a graph (sequence length 0) is not counted. A runner
that passes one chunk at a time (transformers_runner.py) tells the phase itself (`add_phase`).
"""

from __future__ import annotations

import torch

from hybrid.engine.step.forward_batch import ForwardBatch

PREFILL, DECODE = 0, 1


class RoutingRecorder:
    def __init__(self, layer_ids: list[int], num_experts: int) -> None:
        self.layer_ids = list(layer_ids)  # model layer index of each recorded MoE layer
        self.num_experts = num_experts
        self._slot = {layer: i for i, layer in enumerate(self.layer_ids)}
        self._counts: dict[torch.device, torch.Tensor] = {}  # [2, L, E] int64 per device
        self._tokens: dict[torch.device, torch.Tensor] = {}  # [2] int64
        self.current: ForwardBatch | None = None  # the step a router without one runs in
        self._memo: tuple | None = None  # (step, (device, rows), _rows of that step)

    def add(self, layer: int, ids: torch.Tensor, fb: ForwardBatch | None = None) -> None:
        """Count the choices `ids` [N, K] of model layer `layer` in step `fb` (None: the step
        `current` names)."""
        fb = fb or self.current
        if fb is None or layer not in self._slot:
            return
        counts, tokens = self._tables(ids.device)
        slot = self._slot[layer]
        base, valid, phase = self._rows(fb, ids, fresh=slot == 0)
        # a padded row's ids may be anything (its hidden state is not a token's); it is not
        # counted (valid 0) but its index must stay inside the table
        flat = (base + slot * self.num_experts)[:, None] + ids.clamp(0, self.num_experts - 1)
        counts.view(-1).index_add_(0, flat.reshape(-1), valid.expand_as(ids).reshape(-1))
        if slot == 0:
            tokens.index_add_(0, phase, valid[:, 0])

    def add_phase(self, layer: int, ids: torch.Tensor, phase: int) -> None:
        """Count the choices `ids` [N, K] of model layer `layer`, every row a token of `phase`
        (PREFILL or DECODE)."""
        if layer not in self._slot:
            return
        counts, tokens = self._tables(ids.device)
        slot = self._slot[layer]
        flat = (phase * len(self.layer_ids) + slot) * self.num_experts + ids.clamp(
            0, self.num_experts - 1)  # [N, K]
        counts.view(-1).index_add_(0, flat.reshape(-1), torch.ones_like(flat).reshape(-1))
        if slot == 0:
            tokens[phase] += ids.shape[0]

    def _rows(self, fb: ForwardBatch, ids: torch.Tensor, fresh: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's per-row (offset of its phase's table [N], 1 if counted [N, 1], phase [N]),
        made by its first MoE layer (`fresh`) and reused by the others (the same step on the
        same device). Made anew at every first layer, never carried from one run to the next:
        a graph's warm-up and capture run the same ForwardBatch, and rows made by the warm-up
        would be frozen into the graph instead of read from each replay's sequence lengths."""
        key = (ids.device, ids.shape[0])
        if not fresh and self._memo is not None and self._memo[0] is fb and self._memo[1] == key:
            return self._memo[2]  # (the memo holds fb, so a new step can never share its id)
        n, dev = ids.shape[0], ids.device
        b = min(fb.num_decodes, n)
        phase = torch.full((n,), PREFILL, dtype=torch.int64, device=dev)
        phase[:b] = DECODE
        valid = torch.ones(n, 1, dtype=torch.int64, device=dev)
        if b:  # a graph's padding rows have length 0
            valid[:b, 0] = (fb.seq_lens[:b].to(dev) > 0).to(torch.int64)
        rows = (phase * (len(self.layer_ids) * self.num_experts), valid, phase)
        self._memo = (fb, key, rows)
        return rows

    def _tables(self, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if dev not in self._counts:
            # normal tensors, whatever mode the first step runs in: the warm-up runs under
            # inference_mode and graph capture does not, and an inference tensor could not be
            # updated in place there
            with torch.inference_mode(False):
                self._counts[dev] = torch.zeros(2, len(self.layer_ids), self.num_experts,
                                                dtype=torch.int64, device=dev)
                self._tokens[dev] = torch.zeros(2, dtype=torch.int64, device=dev)
        return self._counts[dev], self._tokens[dev]

    def snapshot(self) -> tuple[list[list[list[int]]], list[int]]:
        """(counts [phase][layer][expert], tokens [phase]) so far, summed over devices; phase 0
        is prompt tokens, 1 decode tokens."""
        counts = torch.zeros(2, len(self.layer_ids), self.num_experts, dtype=torch.int64)
        tokens = torch.zeros(2, dtype=torch.int64)
        for dev, c in self._counts.items():
            counts += c.cpu()
            tokens += self._tokens[dev].cpu()
        return counts.tolist(), tokens.tolist()

    def reset(self) -> None:
        for c in (*self._counts.values(), *self._tokens.values()):
            c.zero_()
