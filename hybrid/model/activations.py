"""How many prompt tokens a step takes when `--chunk-size` is not given, and the activation
memory that takes (no torch here; the engine chooses with it at start-up, `hybrid rules
explain` counts it from the headers).

A step that streams its MoE layers' experts to the GPU pays each layer's copy once whatever its
token count (hybrid/engine/prefill/prefill_costs.py): a prompt cut into 512-token chunks copies every
layer's experts once per chunk, 16 times for 8K tokens. So where prompt steps may stream (a
CUDA device runs the model, some routed experts live on the CPU, `--prefill-experts` is not
"cpu"), a chunk is as large as activation memory allows, up to STREAM_CHUNK; elsewhere (the CPU
experts' cost grows with the tokens whatever the chunk) it stays CPU_CHUNK, which keeps a long
prompt from holding the batch for long on a CPU machine.

Activation bytes a token are estimated from the model's shapes (`activation_bytes_per_token`):
the float32 rows a prefill step holds at its peak, summed over the largest tensors of one layer
(a step runs the layers one after another, so one layer's working set is live at a time) plus
the rows that live across layers.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_CHUNK = 512
STREAM_CHUNK = 8192
ACTIVATION_SHARE = 0.25  # of the GPU memory free after weights and KV cache (streaming takes half)
CHUNK_STEP = 256  # chunks are whole multiples of this (the product kernels' largest tile)


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
        """From a transformers DeepSeek config or a `hybrid.model.spec.ModelSpec` (the GGUF's
        header; it names the head count `num_heads`)."""
        heads = getattr(config, "num_attention_heads", None) or config.num_heads
        return cls(config.hidden_size, heads,
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
