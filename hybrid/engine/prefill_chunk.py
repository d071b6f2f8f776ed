"""How many prompt tokens a step takes when `--chunk-size` is not given (no torch here).

A step that streams its MoE layers' experts to the GPU pays each layer's copy once whatever its
token count (prefill_costs.py): a prompt cut into 512-token chunks copies every layer's experts
once per chunk, 16 times for 8K tokens (GPU machine: 8K prompt 3.45 s at 512-token chunks,
1.15 s at 8192). So where prompt steps may stream (a CUDA device runs the model, some routed
experts live on the CPU, `--prefill-experts` is not "cpu"), a chunk is as large as activation
memory allows, up to STREAM_CHUNK; elsewhere (the CPU experts' cost grows with the tokens
whatever the chunk) it stays CPU_CHUNK, which keeps a long prompt from holding the batch for
long on a CPU machine.

Beside decodes a step takes fewer prompt tokens (`choose_decode_chunk_size`): a chunk that
streams passes the layers over several steps (layered_prefill.py), one or more MoE layers a
step, so each step's share of it must stay near a decode step's time for the decoding streams'
gaps to stay within a few decode steps. The most tokens whose one streamed layer costs at most
DECODE_STEP_SHARE times a decode step's CPU experts (both from the start-up cost model), so an
8K prompt is uploaded once where a layer of it fits that budget, not once per 2048 tokens.

Activation bytes a token are estimated from the model's shapes (`activation_bytes_per_token`):
the float32 rows a prefill step holds at its peak, summed over the largest tensors of one layer
(a step runs the layers one after another, so one layer's working set is live at a time) plus
the rows that live across layers. `hybrid rules explain` counts the same figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.engine.prefill_costs import ExpertPlacement

CPU_CHUNK = 512
STREAM_CHUNK = 8192
ACTIVATION_SHARE = 0.25  # of the GPU memory free after weights and KV cache (streaming takes half)
CHUNK_STEP = 256  # chunks are whole multiples of this (the product kernels' largest tile)
DECODE_STEP_SHARE = 2.0  # a layered chunk's layer beside decodes: at most this x a decode step
UNMEASURED_DECODE_CHUNK = 2048  # beside decodes where nothing was measured (forced streaming)


@dataclass(frozen=True)
class ModelShapes:
    """The shapes that size a prefill step's activations (transformers' config names)."""

    hidden_size: int
    num_attention_heads: int
    qk_head_dim: int  # qk_nope_head_dim + qk_rope_head_dim
    v_head_dim: int
    kv_lora_rank: int
    intermediate_size: int  # dense layers' MLP
    moe_intermediate_size: int
    num_experts_per_tok: int

    @classmethod
    def of(cls, config) -> ModelShapes:
        """From a transformers DeepSeek config."""
        return cls(config.hidden_size, config.num_attention_heads,
                   config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim,
                   config.kv_lora_rank, config.intermediate_size, config.moe_intermediate_size,
                   config.num_experts_per_tok)


def activation_bytes_per_token(s: ModelShapes) -> int:
    """Peak float32 bytes a prompt token holds on the GPU during a prefill step (an estimate:
    the residual, its norm and the layer's output; then the largest of attention's expanded
    heads, the dense MLP's gate and up rows, the routed experts' grouped rows)."""
    across_layers = 4 * s.hidden_size  # residual, normed rows, layer output, routed sum
    attention = s.num_attention_heads * (2 * s.qk_head_dim + 2 * s.v_head_dim) + s.kv_lora_rank
    dense_mlp = 3 * s.intermediate_size  # gate, up, their product
    routed = s.num_experts_per_tok * (3 * s.moe_intermediate_size + s.hidden_size)
    return 4 * (across_layers + max(attention, dense_mlp, routed))


def choose_chunk_size(can_stream: bool, bytes_per_token: int, free_bytes: int,
                      max_request_tokens: int) -> int:
    """Prompt tokens a step takes: CPU_CHUNK unless prompt steps may stream, else the most
    tokens whose activations fit ACTIVATION_SHARE of `free_bytes`, in whole CHUNK_STEPs, within
    [CPU_CHUNK, STREAM_CHUNK] and no more than a request can hold (at least CPU_CHUNK even when
    memory is short: the budget check is the rules' reserve's job)."""
    if not can_stream:
        return CPU_CHUNK
    fits = int(free_bytes * ACTIVATION_SHARE) // max(1, bytes_per_token)
    chunk = min(STREAM_CHUNK, fits, max(max_request_tokens, CPU_CHUNK))
    return max(CPU_CHUNK, chunk // CHUNK_STEP * CHUNK_STEP)


def choose_decode_chunk_size(placement: ExpertPlacement, chunk_size: int,
                             num_layers: int) -> int:
    """Prompt tokens a step takes while others decode (at most `chunk_size`).

    Nothing streams: CPU_CHUNK (the chunk's CPU experts run inside the decode step). Streaming
    forced (nothing measured): UNMEASURED_DECODE_CHUNK. Measured: the most tokens, in whole
    CHUNK_STEPs, whose one streamed layer costs at most DECODE_STEP_SHARE x a one-token decode
    step's CPU experts, and at least the fewest tokens at which every layer streams (a chunk
    that does not stream whole is no layered chunk)."""
    if not placement.layer_nbytes or placement.mode == "cpu":
        return min(chunk_size, CPU_CHUNK)
    costs = placement.costs
    if costs is None:
        return min(chunk_size, UNMEASURED_DECODE_CHUNK if placement.mode == "stream"
                   else CPU_CHUNK)
    budget = DECODE_STEP_SHARE * num_layers * costs.costs(1, costs.layer_nbytes)[1]
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
