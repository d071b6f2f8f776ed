"""Run one scheduled batch, mixed prefill chunks and decodes, as a single forward.

All N tokens of the step go through the model as rows [N, H] (decodes first); the attention
operators find their sequences and cache rows in a `ForwardBatch`, built on the host and copied
to the device once. Only the rows that sample (the last token of each chunk that reaches its
request's newest token) go through the final norm and lm_head: with a 129K vocabulary that is
most of the head's cost saved during prefill.

Decode-only steps replay CUDA graphs (cuda_graphs.py) when the model runs on one CUDA device
with every MoE layer's routed experts on the CPU, unless `cuda_graphs` is off; everything else
runs the same DecoderProgram eagerly. A step with prompt tokens may stream some MoE layers'
routed experts to the GPU instead of handing its rows to the CPU (`--prefill-experts`,
expert_stream.py, the choice per layer from prefill_costs.py). Start-up runs every shape a
step can take once (`warm_up`), so no request pays for compiling a kernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from hybrid.engine import decode_attention, layered_prefill, prefill_setup
from hybrid.engine.config import EngineConfig
from hybrid.engine.decoder import DecoderProgram, StepState
from hybrid.engine.experts_bridge import ExpertsBridge
from hybrid.engine.forward_batch import ForwardBatch, StepLayout
from hybrid.engine.kv_cache import PagedLatentCache
from hybrid.engine.prefill_chunk import choose_decode_chunk_size, choose_in_flight_chunk_size
from hybrid.engine.routing_recorder import RoutingRecorder
from hybrid.engine.scheduler import ScheduledBatch
from hybrid.engine.step_result import StepResult
from hybrid.errors import HybridError
from hybrid.model.activations import ModelShapes, activation_bytes_per_token, choose_chunk_size
from hybrid.ops.experts import ExpertsOp
from hybrid.ops.mla_attention import MLAAttentionOp

log = logging.getLogger("hybrid.engine")


class ModelRunner:
    def __init__(self, model: nn.Module, config: EngineConfig, max_request_tokens: int,
                 progress: Callable[[str], None] | None = None) -> None:
        self.model = model
        self.config = config
        self.page_size = config.page_size
        attention = [layer.self_attn for layer in model.model.layers]
        for i, op in enumerate(attention):
            if not isinstance(op, MLAAttentionOp):
                raise HybridError(
                    f"model.layers.{i}.self_attn is {type(op).__name__}; the serving engine "
                    f"needs the mla_attention operator on every layer's self_attn: add or fix "
                    f"that rule in your optimize-rules file")
        self.cache = PagedLatentCache(attention, config.num_pages * config.page_size)
        self.device = attention[0].device
        hf = model.config
        self.chunk_size = config.chunk_size or self._auto_chunk_size(max_request_tokens,
                                                                              progress)
        # a step carries at most max_batch_size decodes plus chunk_size prompt tokens
        self.max_tokens = self.chunk_size + config.max_batch_size
        self.bridge = ExpertsBridge(self.max_tokens, hf.hidden_size, hf.num_experts_per_tok,
                                    self.device)
        self.program = DecoderProgram(model, self.bridge)
        self.recorder = install_recorder(model, self.program) if config.record_routing else None
        self.max_pages = -(-max_request_tokens // config.page_size)
        # The model's own stream, not CUDA's legacy default one: there, a small pinned
        # host-to-device copy (as the CPU experts' sum coming back, per layer and step)
        # waited for the expert stream's unit copies on their side stream (H100: 11.4 ms
        # behind two 300 MB copies, 0.004 ms on a stream of its own; scripts/
        # probe_stream_overlap.py). Start-up (warm-up, costs, capture) and every step run
        # on it.
        self.model_stream = torch.cuda.Stream(self.device, priority=-1) \
            if self.device.type == "cuda" else None
        # A prompt chunk passed over steps (layered_prefill.py) runs its layers on a stream of
        # its own, launched before the step's decodes: the GPU runs them while the host runs
        # the decodes' CPU experts (the GPU otherwise idles there), not after them
        # (docs/serving.md). The model stream's higher priority keeps decode kernels first.
        self.job_stream = torch.cuda.Stream(self.device, priority=0) \
            if self.device.type == "cuda" and config.overlap_prefill \
            and not config.record_routing else None
        self._retired = None  # a job finished this step: alive until the model stream waits
        with self.on_stream():
            self._start_up(config, attention, progress)

    def _auto_chunk_size(self, max_request_tokens: int,
                         progress: Callable[[str], None] | None) -> int:
        """prefill_chunk.py's choice for this model and device, after weights and KV cache."""
        can_stream = self.device.type == "cuda" and self.config.prefill_experts != "cpu" and \
            any(isinstance(op, ExpertsOp) and op.stream_parts is not None
                for op in self.model.modules())
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 0
        per_token = activation_bytes_per_token(ModelShapes.of(self.model.config))
        chunk = choose_chunk_size(can_stream, per_token, free, max_request_tokens)
        why = "they may stream experts to the GPU" if can_stream else "no streamed experts"
        line = (f"prompt steps of up to {chunk} tokens ({why}; {per_token / 1024:.0f} KiB of "
                f"activations a token; --chunk-size sets it)")
        if progress is not None:  # said once: as a start-up line, else logged
            progress(line)
        else:
            log.info("%s", line)
        return chunk

    def on_stream(self):
        """The context every step's device work runs in: the model's stream made current on
        the calling thread (a no-op on the CPU)."""
        return torch.cuda.stream(self.model_stream)

    def _start_up(self, config: EngineConfig, attention: list[MLAAttentionOp],
                  progress: Callable[[str], None] | None) -> None:
        """Everything after the buffers: attention backend, streamed experts, warm-up, CUDA
        graphs, the prefill cost model."""
        hf = self.model.config
        self.graphs = None
        self.decode_graph = None  # the form of the decode graphs replayed, once captured
        self.attention_backend, self.flashinfer = decode_attention.build(
            config.attention_backend, attention, self.page_size, self.max_pages)
        self.stream = prefill_setup.build_stream(self.program.moe_layers, config, self.device)
        self.program.stream = self.stream
        if self.stream is not None:  # its grouped launches first: warm-up steps stream
            prefill_setup.warm_up(self.stream, self.program.moe_layers[0], hf.hidden_size)
        self.job = None  # a LayeredPrefill in flight
        self.layered_jobs = 0  # chunks passed over several steps so far
        if config.cuda_graphs and self.device.type == "cuda" and self.program.can_capture \
                and _one_device(self.model, self.device):
            self.warm_up(progress)
            self.decode_graph = config.decode_graph
            if self.decode_graph == "auto":
                self.decode_graph = self._measure_decode_graphs(progress)
            self.graphs = self.capture_graphs(self.decode_graph, progress)
        elif self.device.type == "cuda":
            self.warm_up(progress, decode=True)
        self.placement = prefill_setup.placement(self.stream, self.program.moe_layers, config,
                                                 hf.hidden_size, progress)
        self.decode_chunk_size = config.decode_chunk_size or choose_decode_chunk_size(
            self.placement, self.chunk_size, len(self.program.moe_layers))
        if config.decode_chunk_size is None and progress is not None:
            progress(f"beside decoding requests, prompt steps of up to "
                     f"{self.decode_chunk_size} tokens (--decode-chunk-size sets it)")
        self.in_flight_chunk_size = choose_in_flight_chunk_size(
            self.placement, self.decode_chunk_size, len(self.program.moe_layers))
        if self.in_flight_chunk_size < self.decode_chunk_size and progress is not None:
            progress(f"while a long prompt passes the layers beside decodes, other prompts "
                     f"take up to {self.in_flight_chunk_size} tokens a step")
        if self.recorder is not None:
            self.recorder.reset()  # start-up's warm-up steps are not traffic

    def _measure_decode_graphs(self, progress: Callable[[str], None] | None) -> str:
        """graph_choice.py: the faster form of decode graphs here ("step" where no MoE layer's
        experts are on the CPU: the forms are then the same graphs)."""
        from hybrid.engine import graph_choice

        if not self.program.moe_layers:
            return "step"
        if progress is not None:
            progress("timing decode steps as one graph against layer by layer")
        seconds = graph_choice.measure(lambda form: self.capture_graphs(form, max_batch_size=1),
                                       self.device)
        chosen = graph_choice.faster(seconds)
        line = graph_choice.describe(seconds, chosen)
        if progress is not None:
            progress(line)
        else:
            log.info("%s", line)
        return chosen

    def capture_graphs(self, decode_graph: str, progress: Callable[[str], None] | None = None,
                       max_batch_size: int | None = None):
        """-> DecodeGraphs of every batch bucket up to `max_batch_size` (the config's when
        None), `decode_graph` "step" or "layers" (also for benchmarks that compare the two in
        one process)."""
        from gpu_kernels.mla_decode import choose_splits
        from hybrid.engine.cuda_graphs import DecodeGraphs

        heads = self.program.inner.layers[0].self_attn.heads
        capacity = self.max_pages * self.page_size
        return DecodeGraphs(self.program, self.cache, self.page_size, self.max_pages,
                            max_batch_size or self.config.max_batch_size, self.device,
                            lambda b: choose_splits(b, heads, capacity), progress,
                            whole_step=decode_graph == "step" and bool(self.program.moe_layers),
                            flashinfer=self.flashinfer)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepResult:
        """One step: the batch's chunks in one forward, and the layered chunk's next layers."""
        chunks = batch.chunks
        layers = len(self.program.moe_layers)
        new = finished = done = None
        streamed = 0
        if self.job is None and self.stream is not None \
                and (new := layered_prefill.candidate(batch, self.placement, layers)) is not None:
            chunks = [x for x in chunks if x is not new]
        overlapped = self.job is not None and self.job_stream is not None and bool(chunks)
        if overlapped:  # queued first, on its stream: it runs beside this step's CPU experts
            done, streamed, finished = self._advance_job(decodes=True)
        logits, on_stream, on_cpu = self._run(chunks, may_stream=self.job is None and new is None)
        if new is not None:
            # after the decodes are queued: the pass's first expert copies (two layers' worth)
            # would otherwise sit in the host-to-device queue ahead of the decode step's
            # per-layer copies of the CPU experts' output, and stretch it by their length
            # (docs/serving.md)
            self._start_job(new)
        if self.job is not None and not overlapped:
            done, streamed, finished = self._advance_job(decodes=bool(chunks))
        if self._retired is not None:  # the job's last pieces before its logits are read
            self.model_stream.wait_stream(self.job_stream)
            self._retired = None
        if done is not None:
            logits = torch.cat([logits, done])
        completed = [c for c in batch.chunks if c is not new]
        if finished is not None:
            completed.append(finished)
        return StepResult(logits, completed, new, streamed + on_stream, on_cpu)

    def drop_job(self, request=None) -> None:
        """Forget the layered chunk (of `request`, or any): its request was cancelled or its
        step failed. Work already queued on the device finishes before any later step's."""
        if self.job is not None and (request is None or self.job.chunk.request is request):
            if self.job_stream is not None:  # its pages and buffers are reused after this
                self.model_stream.wait_stream(self.job_stream)
            self.job = None

    def _start_job(self, chunk) -> None:
        layers = len(self.program.moe_layers)
        fb = ForwardBatch.build([(chunk.token_ids, chunk.request.page_ids, chunk.start,
                                  chunk.samples)], self.page_size, self.cache, self.device)
        self.stream.begin(list(range(layers)))
        per_step = layered_prefill.layers_per_step(self.placement, len(chunk.token_ids), layers)
        if self.job_stream is not None:  # its pieces read what this stream queued
            self.job_stream.wait_stream(self.model_stream)
        self.job = layered_prefill.LayeredPrefill(
            chunk, StepState(fb, num_real=fb.num_tokens, streamed=frozenset(range(layers))),
            per_step)
        self.layered_jobs += 1
        log.debug("a %d-token chunk passes the layers over steps, %d MoE layers a step",
                  len(chunk.token_ids), per_step)

    def _advance_job(self, decodes: bool) -> tuple[torch.Tensor | None, int, object]:
        """The layered chunk's next MoE layers (all that remain when no decode waits) ->
        (its logits rows when its pass ended (none if it does not sample), else None; the MoE
        layers it streamed; its chunk when its pass ended, else None)."""
        job = self.job
        if decodes and not job.waited:  # the starting step: its copies queue, nothing runs
            job.waited = True
            return None, 0, None
        stop, before = job.next_stop(self.program.num_pieces, decodes), job.done
        if self.job_stream is None:
            logits = self.program.run_pieces(job.state, job.pieces, stop)
        else:
            with torch.cuda.stream(self.job_stream):
                logits = self.program.run_pieces(job.state, job.pieces, stop)
        job.pieces = stop
        streamed = job.done - before
        if logits is None:
            return None, streamed, None
        if self.job_stream is not None:
            # read on the model stream (after run() makes it wait): not reused before that;
            # the job's tensors stay alive until then
            logits.record_stream(self.model_stream)
            self._retired = job
        self.job = None
        return logits, streamed, job.chunk

    def _run(self, batch_chunks, may_stream: bool) -> tuple[torch.Tensor, int, int]:
        """One forward over `batch_chunks` (graphs for decode-only steps) -> (their logits,
        MoE layers streamed, MoE layers on the CPU)."""
        layers = len(self.program.moe_layers)
        if not batch_chunks:
            return torch.empty(0, self.model.config.vocab_size, device=self.device), 0, 0
        chunks = [(c.token_ids, c.request.page_ids, c.start, c.samples) for c in batch_chunks]
        if self.graphs is not None and len(chunks) <= self.graphs.max_batch \
                and all(len(c[0]) == 1 for c in chunks):
            return self.graphs.run(chunks), 0, layers
        fb = ForwardBatch.build(chunks, self.page_size, self.cache, self.device)
        if self.flashinfer is not None:
            self.flashinfer.attach(fb)
        streamed = self.placement.streamed(fb.num_tokens, any(len(c[0]) > 1 for c in chunks)) \
            if may_stream else ()
        if streamed:
            self.stream.begin(streamed)
            log.debug("step of %d tokens streams %d of %d MoE layers' experts", fb.num_tokens,
                      len(streamed), len(self.program.moe_layers))
        logits = self.program.run(StepState(fb, num_real=fb.num_tokens,
                                            streamed=frozenset(streamed)))
        return logits, len(streamed), layers - len(streamed)

    @torch.inference_mode()
    def warm_up(self, progress: Callable[[str], None] | None = None,
                decode: bool = False) -> None:
        """Compile every kernel variant a step can need before the first request: a
        prefill-shaped step of each token-count class of the product kernels' tiles (and of
        chunk_size), every row sampling up to the largest class (the head's products take
        those counts too), and with `decode` a decode-shaped step (without CUDA graphs, whose
        capture does that). Writes only the cache's scratch slot."""
        from gpu_kernels.qmatmul import TOKEN_CLASSES

        largest = TOKEN_CLASSES[-1]
        counts = sorted({min(n, self.max_tokens) for n in (*TOKEN_CLASSES,
                                                           self.chunk_size)})
        for i, n in enumerate(counts):
            if progress is not None:
                progress(f"compiling kernels: a step of {n} tokens ({i + 1}/{len(counts)})")
            fb = ForwardBatch.scratch_prefill(n, self.page_size, self.cache, self.device,
                                              samples=n if n <= largest else 1)
            # steps past the product classes stream where they can (as served: the CPU
            # experts add no kernel variant, and cost seconds at chunk_size tokens)
            streamed = range(len(self.program.moe_layers)) \
                if self.stream is not None and n > largest else range(0)
            if streamed:
                self.stream.begin(streamed)
            self.program.run(StepState(fb, num_real=n, streamed=frozenset(streamed)))
        for op in self.model.modules():
            if isinstance(op, ExpertsOp):  # on-device experts: block sizes no step picks
                op.warm_up()
        if decode:
            _, fb = ForwardBatch.scratch_decode(StepLayout(1, 1, self.max_pages, 1),
                                                self.page_size, self.cache, self.device)
            if self.flashinfer is not None:  # the padding row planned as one token
                self.flashinfer.attach(fb)
            self.program.run(StepState(fb, num_real=1))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _one_device(model: nn.Module, device: torch.device) -> bool:
    """Every operator but the CPU experts on `device` (a CUDA graph captures one device)."""
    for module in model.modules():
        if not type(module).__module__.startswith("hybrid.ops") or isinstance(module, ExpertsOp):
            continue
        if module.device != device:
            return False
    return True


def install_recorder(model: nn.Module, program: DecoderProgram) -> RoutingRecorder:
    """A RoutingRecorder on every MoE layer's router: the program records the routers it runs
    itself, each gate the ones a MoE block run in place makes."""
    from hybrid.ops.gate import GateOp

    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "experts")]
    if not all(isinstance(g, GateOp) for g in gates):
        raise HybridError("recording routing needs every MoE router on the gate operator: "
                          "add `replace: {class: gate}` for the routers to the rule file")
    recorder = RoutingRecorder([g.layer_index for g in gates], model.config.n_routed_experts)
    for g in gates:
        g.recorder = recorder
    program.recorder = recorder
    return recorder
