"""A share of every step's routed experts read by the GPU over PCIe while the CPU reads the rest.

The CPU's cores read host memory at ~100 GB/s alone; a kernel reading page-locked host memory
over PCIe adds ~48 GB/s on top of the ~84 the cores keep meanwhile (scripts/probe_dram_share.py
on the H200 host: the memory has more bandwidth than the 16 cores draw). So a bridged layer's
step splits the experts its rows chose: of the U distinct experts used (those held on the GPU
left out), the lowest-numbered round(share * U) are fetched by the GPU (their bytes gathered
from the registered host copy the stream reads, gpu_kernels/host_gather.py, turned into planes
as the stream does, multiplied in grouped launches) and their pairs go to the host as -1, as
held experts' do; the CPU computes the rest. Both halves end about together when `share` is
the GPU's part of the two bandwidths. A step gathers, unpacks and multiplies only the slots its
batch can fill (`step_slots`: 2 for one stream of V2-Lite at 0.35), never all `slots`.
The decoder launches it after the hand-over, with the shared expert, as held experts.

    choose(ids)               [N, K] slot of each pair's expert among this step's fetched, -1
    __call__(x, local, w)     [N, H] f32: the fetched experts' share of the layer's output

Device ops only, static shapes: a whole-step CUDA graph holds it. The result is the GPU kernels'
products on the same blocks (as for held experts): equal to the CPU's within their roundings.
The share lives in a device tensor, so a captured graph follows `set_share`.
"""

from __future__ import annotations

import math

import torch

from hybrid.engine.prefill.expert_stream import StreamTensor, host_tensor

# the GPU's part of the two bandwidths when both read at once (probe_dram_share.py, H200
# host: zero-copy reads 47.5 GB/s beside the cores' 83.5)
DEFAULT_SHARE = 0.35
MEMORY_BYTES = 512 << 20  # GPU memory for the fetched experts' raw slots and their planes


class FetchedExperts:
    def __init__(self, parts: tuple[StreamTensor, ...], raw: list[torch.Tensor], share: float,
                 limit: float = math.inf) -> None:
        """parts: one MoE layer's expert tensors as the stream reads them (their host bytes
        registered with CUDA where the device is a GPU); raw: per part a [slots, bytes an
        expert] uint8 device buffer (the layers of a step may share them: they run in turn),
        `slots` the most experts one step fetches; limit: the SwiGLU's clamp."""
        slots = raw[0].shape[0]
        if not 0 < share < 1 or slots < 1:
            raise ValueError(f"fetched experts: share {share} (in (0, 1)), {slots} slots")
        self.parts, self.raw, self.slots, self.limit = parts, raw, slots, limit
        self.most_share = share  # set_share may lower the share, never raise it past this
        self.device = raw[0].device
        device = self.device
        self.num_experts = parts[0].num_experts
        self.share = torch.tensor([share], dtype=torch.float32, device=device)
        self.host = [host_tensor(m.host) for m in parts]  # [E, B] uint8 each
        self.which = torch.full((slots,), -1, dtype=torch.long, device=device)  # slot -> expert
        self._experts = torch.arange(self.num_experts, device=device)

    def set_share(self, share: float) -> None:
        """The share the next steps fetch, at most the one built with (captured graphs read it
        from the device)."""
        if not 0 <= share <= self.most_share:
            raise ValueError(f"fetched experts: share {share}, built for 0 to {self.most_share}")
        self.share.fill_(share)

    def step_slots(self, rows: int, top_k: int) -> int:
        """The slots a step of `rows` rows uses: the share built with of the most experts such
        a step picks. A step's shape fixes it, so each captured batch size multiplies only its
        own slots (1 stream of 6 experts a token: 2 at share 0.35, not all the slots)."""
        want = math.floor(self.most_share * min(self.num_experts, rows * top_k) + 0.5)
        return max(1, min(self.slots, want))

    def choose(self, ids: torch.Tensor, held: torch.Tensor | None = None) -> torch.Tensor:
        """ids [N, K] -> [N, K] int64: each pair's slot among the experts fetched this step, -1
        for the rest; `held` [E] bool marks experts the GPU holds anyway (never fetched).
        Sets the slots' experts for __call__."""
        e = self.num_experts
        valid = (ids >= 0) & (ids < e)
        safe = torch.where(valid, ids, 0).long()  # [N, K]
        if held is not None:
            valid &= ~held[safe]
        used = torch.zeros(e + 1, dtype=torch.bool, device=ids.device)
        used = used.index_fill_(0, torch.where(valid, safe, e).reshape(-1), True)[:e]  # [E]
        rank = used.long().cumsum(0) - 1  # [E] among the used, by number
        step = self.step_slots(*ids.shape)
        take = torch.floor(used.sum() * self.share + 0.5).clamp(max=step)  # [1]
        fetched = used & (rank < take)  # [E]
        self.which.fill_(-1)
        spill = torch.where(fetched, rank, self.slots)  # the rest into a slot past the end
        which = torch.full((self.slots + 1,), -1, dtype=torch.long, device=ids.device)
        self.which.copy_(which.scatter_(0, spill, self._experts)[:self.slots])
        slot = torch.where(fetched, rank, -1)  # [E]
        return torch.where(valid, slot[safe], -1)

    def __call__(self, x: torch.Tensor, local: torch.Tensor, weights: torch.Tensor
                 ) -> torch.Tensor:
        """x [N, H], local (choose's slots) [N, K], weights [N, K] -> [N, H] f32."""
        from gpu_kernels import moe_grouped
        from gpu_kernels.host_gather import gather_rows

        n = self.step_slots(*local.shape)  # choose never gives a slot past these
        planes = []
        for part, host, raw in zip(self.parts, self.host, self.raw):
            gather_rows(host, self.which[:n], raw[:n])
            planes.append(part.planes(raw[:n].reshape(-1), n))
        return moe_grouped.moe_experts(x.float().contiguous(), local, weights,
                                       tuple(planes[:-1]), planes[-1], n, limit=self.limit)


def slots_for(share: float, num_experts: int, tokens: int, top_k: int, expert_nbytes: int,
              memory_bytes: int) -> int:
    """The slots a fetcher needs: its share of the most experts a step of `tokens` rows can
    use, within `memory_bytes` (raw slots and the planes made from them)."""
    most = math.floor(share * min(num_experts, tokens * top_k) + 0.5)
    return max(1, min(most, memory_bytes // (2 * expert_nbytes)))


def attach(stream, layers: list, device: torch.device, tokens: int,
           memory_bytes: int = MEMORY_BYTES) -> str | None:
    """Give each of `layers` (the decoder's bridged ExpertsOps, the stream's layers in order)
    whose rule asks for `fetch_experts` a fetcher onto `device`, over the stream's host bytes
    (page-locked); one set of raw slots serves them all. -> what was done (None: no layer
    asks), for the start-up's log."""
    wanted = [(i, op) for i, op in enumerate(layers) if op.fetch_share > 0]
    if not wanted:
        return None
    if stream is None or (device.type == "cuda" and not stream.pinned):
        why = "no expert stream" if stream is None else "the experts' host bytes are not pinned"
        return f"fetch_experts asked for, but the CPU computes every expert: {why}"
    if any(op.defer_experts for _, op in wanted):
        return "fetch_experts asked for, but the layers defer experts: drop one of them"
    share = max(op.fetch_share for _, op in wanted)
    parts = stream.layers[wanted[0][0]]
    top_k = wanted[0][1].top_k
    slots = slots_for(share, stream.num_experts, tokens, top_k, stream.expert_nbytes,
                      memory_bytes)
    raw = [torch.empty(slots * max(stream.layers[i][j].expert_nbytes for i, _ in wanted),
                       dtype=torch.uint8, device=device) for j in range(len(parts))]
    for i, op in wanted:
        views = [r[:slots * m.expert_nbytes].view(slots, m.expert_nbytes)
                 for r, m in zip(raw, stream.layers[i])]
        op.use_fetcher(FetchedExperts(stream.layers[i], views, op.fetch_share,
                                      op.swiglu_limit))
    return (f"{share:.0%} of each step's routed experts read by the GPU over PCIe in "
            f"{len(wanted)} MoE layers (at most {slots} a step, {sum(r.numel() for r in raw) / 2**20:.0f} MiB)")
