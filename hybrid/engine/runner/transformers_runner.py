"""A step as transformers' own model runs it, for a model whose attention has no operator of
ours yet (DeepSeek-V4: its sliding window with compressed keys, docs/model-files.md).

Each request keeps transformers' own cache (a DynamicCache of the model's config: for V4 the
window and compressed rows of hybrid/model/v4_cache.py), and each step runs its chunks one
after another through the whole model, each on its request's cache, a batch of one; the
routed experts still run on hybrid's CPU kernels where the rules put them. With
`record_routing` a hook on each experts operator counts its layer's choices, prompt and decode
tokens apart (what `hybrid profile` and `hybrid tune` read). The scheduler's
pages only bound the tokens in flight (admission); there is no CUDA graph and no layered
prefill. The prefix cache is a store of whole caches (cache_store.py): one at the end of each
prompt and one at the end of each request, a later request continuing from a copy of the
longest whose tokens begin its prompt.

Invariant: a request's cache holds exactly its first `length` tokens. A chunk whose forward
fails drops its request's cache (some layers may hold part of the chunk), so it is neither
reused nor stored. A chunk that starts past its cache (there is none yet, or it was dropped)
rebuilds it from the store or from nothing and the request's own tokens first; a chunk that
starts before its end (a prefix from the store) computes only its tokens past it.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from torch import nn

from hybrid.engine.config import EngineConfig
from hybrid.engine.runner.cache_store import CacheStore
from hybrid.engine.scheduling.scheduler import ScheduledBatch
from hybrid.engine.step.routing_recorder import DECODE, PREFILL, RoutingRecorder
from hybrid.engine.step.step_result import StepResult
from hybrid.errors import HybridError
from hybrid.model.activations import CPU_CHUNK
from hybrid.model.v4_cache import store_entries
from hybrid.ops.experts import ExpertsOp


@dataclass
class _RequestCache:
    cache: object  # transformers' Cache of this request's tokens
    length: int  # tokens it holds


class TransformersRunner:
    def __init__(self, model: nn.Module, config: EngineConfig, reuse_caches: bool = True) -> None:
        """model: transformers' CausalLM with its experts on our operator (rules applied);
        `reuse_caches`: keep finished prompts' caches for later requests (the prefix cache)."""
        self.model = model.eval()
        embed = model.get_input_embeddings()  # where the token ids go: the step's device
        self.device = embed.device if hasattr(embed, "device") else embed.weight.device
        self.chunk_size = config.chunk_size or CPU_CHUNK
        self.decode_chunk_size = config.decode_chunk_size or self.chunk_size
        self.in_flight_chunk_size = self.decode_chunk_size
        self.recorder = self._recorder(model) if config.record_routing else None
        # the phase of the chunk in the model now (for the recorder); None: not counted
        self._phase: int | None = PREFILL
        self.job = None  # no chunk ever passes the layers over several steps
        experts = [m for m in model.modules() if isinstance(m, ExpertsOp)]
        if any(op.defer_experts for op in experts):
            raise HybridError("defer_experts needs our step program (hybrid/engine/step/); this "
                              "model runs through transformers' forward (DeepSeek-V4 so far): "
                              "drop defer_experts from the rules")
        self._moe_layers = len(experts)
        self._caches: dict[int, _RequestCache] = {}  # id(request) -> its cache
        self.cached_tokens = 0  # prompt tokens that requests took from the store
        # as many tokens as are admitted at once, in a few entries (each holds its layers'
        # windows whatever its length; `rules explain` counts them: model/v4_cache.py)
        self.store = CacheStore(store_entries(config.max_batch_size), config.cache_lens) \
            if reuse_caches and config.cache_lens else None

    def _recorder(self, model: nn.Module) -> RoutingRecorder:
        """A RoutingRecorder fed by a hook on every experts operator: the ids it is called
        with [N, K] are the layer's routing of the chunk running now."""
        layers = [(i, layer.mlp.experts) for i, layer in enumerate(model.model.layers)
                  if isinstance(getattr(layer.mlp, "experts", None), ExpertsOp)]
        recorder = RoutingRecorder([i for i, _ in layers], model.config.n_routed_experts)

        def count(layer: int, args: tuple) -> None:  # None: the operator's inputs unchanged
            if self._phase is not None:
                recorder.add_phase(layer, args[1], self._phase)

        for i, op in layers:
            op.register_forward_pre_hook(lambda _m, args, i=i: count(i, args))
        return recorder

    def on_stream(self):
        """The context of a step's device work: nothing to set (no stream of our own)."""
        return contextlib.nullcontext()

    def drop_job(self, request=None) -> None:
        """Hand `request`'s cache to the store (it ended, or was cancelled); with none, after a
        failed step, every cache is kept: a chunk that finds its cache behind rebuilds it."""
        if request is not None:
            held = self._caches.pop(id(request), None)
            if held is not None and self.store is not None:
                self.store.put(request.token_ids(0, held.length), held.cache)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, before_experts=None, ahead=None, launched=None
            ) -> StepResult:
        """Every chunk of the batch through the model on its request's cache -> one logits
        row per sampling chunk, in order. ModelRunner.run's contract: before_experts() runs
        first; nothing is launched ahead here (ahead and launched are never given: the engine
        overlaps no step of this runner)."""
        assert ahead is None and launched is None, "this runner launches nothing ahead"
        if before_experts is not None:
            before_experts()
        rows = []
        for chunk in batch.chunks:
            # a decode feeds back a generated token; a chunk of prompt tokens is prefill
            self._phase = DECODE if chunk.start >= chunk.request.num_prompt_tokens else PREFILL
            try:
                logits = self._advance(chunk.request, chunk.start, chunk.token_ids)  # [V]/None
            except BaseException:
                # some layers may hold part of the chunk: never reused, never stored
                self._caches.pop(id(chunk.request), None)
                raise
            if chunk.samples:
                rows.append(logits)
        vocab = self.model.config.vocab_size
        logits = torch.stack(rows) if rows else torch.empty(0, vocab, device=self.device)
        # MoE layer-steps, as ModelRunner counts them: a step's layers once, whatever its chunks
        return StepResult(logits.float(), list(batch.chunks), None, 0,
                          self._moe_layers if batch.chunks else 0)

    def _advance(self, request, start: int, token_ids: list[int]) -> torch.Tensor | None:
        """The request's cache grown by `token_ids` at position `start` -> the last token's
        logits [V]; None where the cache held them all already (a stored prefix: never a
        sampling chunk's, as a prompt's last token is always computed)."""
        held = self._caches.get(id(request))
        if held is None or held.length < start:  # none yet, or lost: rebuild
            held = self._caches[id(request)] = self._reused(request, start == 0)
            before = request.token_ids(held.length, start)
            phase, self._phase = self._phase, None  # counted when they first ran
            for at in range(0, len(before), self.chunk_size):
                self._forward(held, before[at:at + self.chunk_size])
            self._phase = phase
        skip = held.length - start  # this chunk's first tokens that the cache holds
        logits = None if skip >= len(token_ids) else self._forward(held, token_ids[skip:])
        end = start + len(token_ids)
        if self.store is not None and end == request.num_prompt_tokens and skip < len(token_ids):
            # the prompt's state: what a next turn repeats (its reply may be re-rendered)
            self.store.put(request.prompt_ids, copy.deepcopy(held.cache))
        return logits

    def _reused(self, request, first: bool) -> _RequestCache:
        """A cache to start `request` from: a copy of the store's longest prefix of its prompt
        (all but the last prompt token at most: that one's logits are computed), else empty.
        `first`: its first chunk (the prefix is reported as its cached tokens)."""
        from transformers import DynamicCache

        found = None if self.store is None else self.store.take(
            request.prompt_ids, request.num_prompt_tokens - 1)
        if found is None:
            return _RequestCache(DynamicCache(config=self.model.config), 0)
        cache, length = found
        if first:
            request.num_cached_tokens = length
            self.cached_tokens += length
        return _RequestCache(cache, length)

    def _forward(self, held: _RequestCache, token_ids: list[int]) -> torch.Tensor:
        n = len(token_ids)
        ids = torch.tensor([token_ids], device=self.device)  # [1, n]
        positions = torch.arange(held.length, held.length + n, device=self.device)[None]
        out = self.model(input_ids=ids, position_ids=positions, cache=held.cache,
                         use_cache=True, logits_to_keep=1)
        held.length += n
        return out.logits[0, -1]
