"""How many prompt tokens a step takes beside decoding requests when `--decode-chunk-size` is
not given (no torch here; the chunk alone: hybrid/model/activations.py).

A chunk that streams passes the layers over several steps beside decodes (layered_prefill.py),
one or more MoE layers a step, so each step's share of it must stay within what
`EngineConfig.decode_gap` allows (`share`: EngineConfig.prompt_share decode steps) for the
decoding streams' gaps to stay within that many decode steps: the most tokens whose one
streamed layer costs at most `share` times a decode step's CPU experts (both from the start-up
cost model), so an 8K prompt is uploaded once where a layer of it fits that budget, not once
per 2048 tokens.
"""

from __future__ import annotations

from hybrid.engine.prefill.prefill_costs import ExpertPlacement
from hybrid.model.activations import CHUNK_STEP, CPU_CHUNK

UNMEASURED_DECODE_CHUNK = 2048  # beside decodes where nothing was measured (forced streaming)


def choose_decode_chunk_size(placement: ExpertPlacement, chunk_size: int,
                             num_layers: int, share: float) -> int:
    """Prompt tokens a step takes while others decode (at most `chunk_size`).

    Nothing streams: CPU_CHUNK (the chunk's CPU experts run inside the decode step). Streaming
    forced (nothing measured): UNMEASURED_DECODE_CHUNK. Measured: the most tokens, in whole
    CHUNK_STEPs, whose one streamed layer costs at most `share` x a one-token decode
    step's CPU experts, and at least the fewest tokens at which every layer streams (a chunk
    that does not stream whole is no layered chunk)."""
    if not placement.layer_nbytes or placement.mode == "cpu":
        return min(chunk_size, CPU_CHUNK)
    costs = placement.costs
    if costs is None:
        return min(chunk_size, UNMEASURED_DECODE_CHUNK if placement.mode == "stream"
                   else CPU_CHUNK)
    budget = share * num_layers * costs.costs(1, costs.layer_nbytes)[1]
    fewest = None
    for n in range(CHUNK_STEP, chunk_size + 1, CHUNK_STEP):
        if len(placement.streamed(n, True)) == len(placement.layer_nbytes):
            fewest = n
            break
    if fewest is None:
        return min(chunk_size, CPU_CHUNK)
    best = fewest
    for n in range(fewest, chunk_size + 1, CHUNK_STEP):
        if max(costs.costs(n, b)[0] for b in placement.layer_nbytes) <= budget:
            best = n
    return best


def choose_in_flight_chunk_size(placement: ExpertPlacement, decode_chunk_size: int,
                                num_layers: int, share: float) -> int:
    """Prompt tokens a decoding step takes from other requests while a layered chunk is in
    flight (at most `decode_chunk_size`). Such tokens run on the CPU experts (one streamed
    chunk at a time), inside the decode step, whose every stream waits for them. So: the most
    tokens whose CPU experts over all layers cost at most `share` x a one-token decode step's,
    the share the layered chunk may add too (0 where nothing was measured: those prompts wait
    for the chunk). Where no chunk can stream there is never one in flight, and this is
    `decode_chunk_size`."""
    if not placement.layer_nbytes or placement.mode == "cpu":
        return decode_chunk_size
    costs = placement.costs
    if costs is None:
        return 0
    one = costs.costs(1, costs.layer_nbytes)[1]
    budget = share * num_layers * one
    best = 0
    for n in range(1, decode_chunk_size + 1):
        if sum(costs.costs(n, b)[1] for b in placement.layer_nbytes) > budget:
            break
        best = n
    return best
