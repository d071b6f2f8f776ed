"""The model runner's start-up: what it measures, compiles and captures once, before the
first request (model_runner.py holds the buffers and runs the steps). Each function takes the
ModelRunner being started (untyped here: this module sits below it, no import back up).

Order matters: the prompt chunk is chosen after the weights and the KV cache took their memory;
the streamed experts' buffers come before the warm-up (warm_up.py), whose long steps stream as
served ones do; the decode graphs are captured after every kernel compiled (their
form timed first where the config leaves it open, graphs/choice.py); the streamed-vs-CPU cost
model is measured last, on the warm kernels, and the chunk sizes beside decodes follow from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from hybrid.engine.attention import select as attention_select
from hybrid.engine.config import EngineConfig
from hybrid.engine.graphs import setup as decode_graphs_setup
from hybrid.engine.prefill import layered_prefill, prefill_setup
from hybrid.engine.prefill.prefill_chunk import (
    choose_decode_chunk_size,
    choose_in_flight_chunk_size,
)
from hybrid.engine.runner.warm_up import warm_up
from hybrid.engine.step.decoder import DecoderProgram
from hybrid.engine.step.routing_recorder import RoutingRecorder
from hybrid.errors import HybridError
from hybrid.model.activations import ModelShapes, activation_bytes_per_token, choose_chunk_size
from hybrid.ops.experts import ExpertsOp
from hybrid.ops.mla_attention import MLAAttentionOp

log = logging.getLogger("hybrid.engine")


def attention_ops(model: nn.Module) -> list[MLAAttentionOp]:
    """Every layer's attention operator; the engine's paged cache needs mla_attention's."""
    attention = [layer.self_attn for layer in model.model.layers]
    for i, op in enumerate(attention):
        if not isinstance(op, MLAAttentionOp):
            raise HybridError(
                f"model.layers.{i}.self_attn is {type(op).__name__}; the serving engine "
                f"needs the mla_attention operator on every layer's self_attn: add or fix "
                f"that rule in your optimize-rules file")
    return attention


def streams(device: torch.device, config: EngineConfig) -> tuple:
    """(the model's stream, the layered prefill's stream or None); both None on the CPU.

    The model's own stream, not CUDA's legacy default one, where a small pinned copy (the CPU
    experts' sum coming back) waits for the expert stream's uploads on their stream
    (docs/long-prompts.md); start-up and every step run on it. A prompt chunk passed over steps
    (layered_prefill.py) runs its layers on a stream of its own while the host runs the
    decodes' CPU experts (docs/serving.md); the model stream's higher priority keeps decode
    kernels first."""
    if device.type != "cuda":
        return None, None
    job = torch.cuda.Stream(device, priority=0) \
        if config.overlap_prefill and not config.record_routing else None
    return torch.cuda.Stream(device, priority=-1), job


def auto_chunk_size(runner, max_request_tokens: int,
                     progress: Callable[[str], None] | None) -> int:
    """prefill_chunk.py's choice for this model and device, after weights and KV cache."""
    can_stream = runner.device.type == "cuda" and runner.config.prefill_experts != "cpu" and \
        any(isinstance(op, ExpertsOp) and op.stream_parts is not None
            for op in runner.model.modules())
    free = torch.cuda.mem_get_info(runner.device)[0] if runner.device.type == "cuda" else 0
    per_token = activation_bytes_per_token(ModelShapes.of(runner.model.config))
    chunk = choose_chunk_size(can_stream, per_token, free, max_request_tokens)
    why = "they may stream experts to the GPU" if can_stream else "no streamed experts"
    line = (f"prompt steps of up to {chunk} tokens ({why}; {per_token / 1024:.0f} KiB of "
            f"activations a token; --chunk-size sets it)")
    if progress is not None:  # said once: as a start-up line, else logged
        progress(line)
    else:
        log.info("%s", line)
    return chunk


def start_up(runner, config: EngineConfig, attention: list[MLAAttentionOp],
             progress: Callable[[str], None] | None, cpu_kernels_ready: Callable[[], None]
             ) -> None:
    """Everything after the runner's buffers, set on it: the attention backend, the streamed
    experts, the warm-up, the CUDA graphs (their form timed where `decode_graph` is "auto"),
    the prefill cost model and the chunk sizes chosen from it. `cpu_kernels_ready` is called
    before the first step that runs the CPU experts (the GPU's kernels compile before it)."""
    hf = runner.model.config
    runner.graphs = None
    runner.decode_graph = None  # the form of the decode graphs replayed, once captured
    runner.attention = attention_select.build(config.attention_backend, attention,
                                              runner.page_size, runner.max_pages)
    runner.stream = prefill_setup.build_stream(runner.program.moe_layers, config, runner.device)
    runner.program.stream = runner.stream
    form = decode_graphs_setup.graph_form(runner, config.decode_graph, progress)
    if config.cuda_graphs and form is not None:
        warm_up(runner, progress, cpu_kernels_ready=cpu_kernels_ready)
        runner.decode_graph = form
        if runner.decode_graph == "auto":
            runner.decode_graph, runner.layered.decode_ms = decode_graphs_setup.measure(runner,
                                                                                  progress)
        runner.graphs = decode_graphs_setup.capture(runner, runner.decode_graph, progress)
    elif runner.device.type == "cuda":
        warm_up(runner, progress, decode=True, cpu_kernels_ready=cpu_kernels_ready)
    cpu_kernels_ready()  # before serving, wherever no warm-up step ran the CPU experts
    runner.placement = prefill_setup.placement(runner.stream, runner.program.moe_layers, config,
                                             hf.hidden_size, progress, runner.chunk_size)
    layers = len(runner.program.moe_layers)
    runner.decode_chunk_size = config.decode_chunk_size or choose_decode_chunk_size(
        runner.placement, runner.chunk_size, layers, config.prompt_share)
    if config.decode_chunk_size is None and progress is not None:
        progress(f"beside decoding requests, prompt steps of up to "
                 f"{runner.decode_chunk_size} tokens (--decode-chunk-size sets it)")
    if progress is not None and layered_prefill.candidate_tokens(
            runner.placement, runner.decode_chunk_size, layers):
        per_step = layered_prefill.layers_per_step(runner.placement, runner.decode_chunk_size,
                                                   layers, config.prompt_share,
                                                   runner.layered.decode_ms)
        progress(f"a prompt chunk of {runner.decode_chunk_size} tokens passes the layers "
                 f"beside decodes, {per_step} MoE layers a step (--decode-gap "
                 f"{config.decode_gap:g})")
    runner.in_flight_chunk_size = choose_in_flight_chunk_size(
        runner.placement, runner.decode_chunk_size, layers, config.prompt_share)
    if runner.in_flight_chunk_size < runner.decode_chunk_size and progress is not None:
        progress(f"while a long prompt passes the layers beside decodes, other prompts "
                 f"take up to {runner.in_flight_chunk_size} tokens a step")
    held = [op.held_summary() for op in runner.model.modules() if isinstance(op, ExpertsOp)]
    if progress is not None and any(held):
        # e.g. pcie_experts (bundled V2-Lite rules): the user sees it is on, and its terms
        progress(f"GPU-held routed experts: {next(h for h in held if h)} "
                 f"({sum(map(bool, held))} MoE layers; gpu_experts / pcie_experts)")
    if runner.recorder is not None:
        runner.recorder.reset()  # start-up's warm-up steps are not traffic


def install_recorder(model: nn.Module, program: DecoderProgram) -> RoutingRecorder:
    """A RoutingRecorder on every MoE layer's router: the program records the routers it runs
    itself, each gate the ones a MoE block run in place makes."""
    from hybrid.ops.layers import GateOp

    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "experts")]
    if not all(isinstance(g, GateOp) for g in gates):
        raise HybridError("recording routing needs every MoE router on the gate operator: "
                          "add `replace: {class: gate}` for the routers to the rule file")
    recorder = RoutingRecorder([g.layer_index for g in gates], model.config.n_routed_experts)
    for g in gates:
        g.recorder = recorder
    program.recorder = recorder
    return recorder
