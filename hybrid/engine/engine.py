"""The engine: `step()` = schedule -> run one batched forward -> sample and update.

Owns the scheduler, the model runner and each running request's output state (outputs.py:
its random generator, incremental detokenizer, stop strings and grammar). It is
single-threaded: the `EngineWorker` wraps it with a lock and a thread for serving, and
`hybrid.LLM` drives it directly for offline generation, so both run the same code. The split into `schedule()`,
`execute()` and `retire()` lets the worker hold its lock only while the queues change, never
during a forward.

Overlapped decode (`overlap_decode`): while every running request decodes, the next step is
scheduled and launched beside this step's CPU experts (launch_ahead.py, on the whole-step
graph's beside thread), its inputs this step's tokens as they are decided on the device (the
graph's greedy picks, or the draw queued after it, into the runner's carried ids). This
step's tokens stay pending (`_pending`) and are read back, detokenized and checked for stops by
the next call (outputs.PendingRead): the picks taken while its step runs up to its first MoE
layer, the rest there too, or, where that step launches the next ahead, first on the beside
thread (a grammar's matcher takes the token before the step launched ahead masks its row, and
the engine's thread goes on to drive the CPU experts sooner). `execute` returns the outputs known
by its end: the step before's where one was pending, else its own. A request that stopped at the
pending step has its next row computed and dropped. Any other step (a prompt, a request
waiting) reads its tokens back at once.
Invariant: from launching a step ahead until its CPU experts are driven, this thread never waits
for the device (no synchronizing copy or read on its stream): the launched step waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.launch_ahead import Ahead, LaunchedAhead, live_rows, rows_of, with_carried
from hybrid.engine.outputs import LaunchedOutputs, PendingRead, RequestOutputs, StepOutput
from hybrid.engine.runner.model_runner import ModelRunner
from hybrid.engine.runner.transformers_runner import TransformersRunner
from hybrid.engine.scheduling.request import Request, RequestStatus
from hybrid.engine.scheduling.scheduler import ScheduledBatch, Scheduler
from hybrid.engine.step.step_result import StepResult
from hybrid.errors import HybridError, RequestRejected
from hybrid.model.spec_v4 import V4Spec

log = logging.getLogger("hybrid.engine")


class Engine:
    def __init__(self, loaded, config: EngineConfig,
                 progress: Callable[[str], None] | None = None) -> None:
        """loaded: a `hybrid.model.loader.LoadedModel` built with optimize rules; `progress`
        hears what start-up is doing (kernel warm-up, CUDA graph capture)."""
        v4 = isinstance(loaded.spec, V4Spec)  # transformers' attention: TransformersRunner
        reuse_caches = config.prefix_cache  # V4's prefix cache: whole caches, in the runner
        config = _for_transformers_runner(config) if v4 else _with_cache_lens(config, loaded)
        self.config = config  # cache_lens chosen
        self.spec = loaded.spec
        self.tokenizer = loaded.tokenizer
        self.scheduler = Scheduler(config, loaded.spec.context_length)
        # the pool first: start-up warm-up and graph capture run the experts on it
        self.cpu_pool = _start_cpu_pool(loaded.model, config.cpu_threads)
        # the runner's start-up compiles the GPU's kernels while the background compile of the
        # CPU experts' ones (started while loading) runs on, and waits for it before its first
        # step that runs them (the kernels are then read from numba's cache)
        if v4:
            _waiter(loaded.compiling, progress)()  # its first step runs the CPU experts
            self.runner = TransformersRunner(loaded.model, config, reuse_caches)
        else:
            self.runner = ModelRunner(loaded.model, config, self.scheduler.max_request_tokens,
                                      progress, _waiter(loaded.compiling, progress))
        # chosen at start-up where the config leaves them open
        self.scheduler.chunk_size = self.runner.chunk_size
        self.scheduler.decode_chunk_size = self.runner.decode_chunk_size
        self.scheduler.in_flight_chunk_size = self.runner.in_flight_chunk_size
        self.outputs = RequestOutputs(loaded.tokenizer, loaded.spec.vocab_size)
        # the runner's carried ids take a step's picks (ModelRunner's; not transformers')
        self.overlap = hasattr(self.runner, "carried_ids") and (
            config.overlap_decode == "on"
            or (config.overlap_decode == "auto" and self.runner.graphs is not None))
        self._pending: LaunchedOutputs | None = None  # a step's tokens not yet read back
        self._launched: LaunchedAhead | None = None  # the next step, launched already
        self._expert_layers = {"stream": 0, "cpu": 0}  # MoE layer-steps so far (/metrics)

    @property
    def expert_layer_counts(self) -> dict[str, int]:
        """MoE layer-steps so far whose routed experts were streamed ("stream") or ran on the
        CPU ("cpu")."""
        return self._expert_layers

    @property
    def cached_prompt_tokens(self) -> int:
        """Prompt tokens admitted with their KV already cached: the scheduler's paged prefix
        cache, or the whole caches a transformers-forward runner reuses (DeepSeek-V4)."""
        return self.scheduler.num_cached_tokens + getattr(self.runner, "cached_tokens", 0)

    def routing_counts(self) -> tuple[list, list[int], list[int]] | None:
        """(counts [phase][layer][expert], tokens [phase], the layers' model indices) of the
        expert choices so far (phase 0: prompt tokens, 1: decode); None unless
        `record_routing` is on."""
        rec = self.runner.recorder
        if rec is None:
            return None
        counts, tokens = rec.snapshot()
        return counts, tokens, rec.layer_ids

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._pending is not None \
            or self._launched is not None

    def add(self, request: Request) -> None:
        """Validate and queue; RequestRejected names the problem (the server's 400)."""
        ids, vocab = request.prompt_ids, self.spec.vocab_size
        if not ids:
            raise RequestRejected("the prompt is empty; give at least one token")
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise RequestRejected(f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        self.scheduler.add(request)

    def schedule(self) -> ScheduledBatch:
        batch = self.scheduler.schedule()
        for r in batch.cancelled:
            self.outputs.drop(r)
            self.runner.drop_job(r)  # before its freed pages go to anyone else
        return batch

    def execute(self, batch: ScheduledBatch,
                schedule_ahead: Callable[[], ScheduledBatch] | None = None
                ) -> list[StepOutput]:
        """Run the batch and sample; requests are not retired here (see `retire`). Returns the
        tokens read back by the end of the call: the pending step's (if any), then this
        step's unless they are left pending. schedule_ahead(): the next batch, scheduled
        while this one's CPU experts run, which is then launched at once where it can be (a
        greedy decode that follows a greedy decode) and passed to the next call."""
        batch = replace(batch, chunks=[c for c in batch.chunks if not c.request.is_finished])
        if not batch.chunks and self.runner.job is None and self._launched is None:
            return self._read_back()
        with self.runner.on_stream():  # the forward, the grammar masks, sampling
            return self._execute(batch, schedule_ahead)

    def _execute(self, batch: ScheduledBatch, schedule_ahead) -> list[StepOutput]:
        """The step: its inputs resolved where the step before's tokens are pending (those read
        back once it is launched), run, then its tokens read back or left pending."""
        batch, launched, read = self._resume(batch)
        earlier = read.into  # the pending step's outputs, once read back
        ahead = Ahead(self.scheduler, self.runner, batch, schedule_ahead,
                      partial(self._launch_picks, [c.request for c in batch.chunks if c.samples],
                              earlier, carry=True), read.finish) \
            if schedule_ahead is not None and self._may_launch_ahead(batch) else None
        try:  # with a step launched ahead, the read back's rest runs beside the CPU experts
            step = self.runner.run(batch, read.take if ahead else read.finish, ahead, launched)
        finally:  # known even if the step failed: abandon_in_flight drives it to its end
            self._launched = ahead.launched if ahead is not None else None
        read.finish()  # where Ahead did not run (a prompt came in: it returned first)
        self._complete(step)
        return earlier + self._sample(step, earlier, ahead if ahead and ahead.scheduled else None)

    def _resume(self, batch: ScheduledBatch) -> tuple:
        """-> (the batch to run: the one launched ahead, or `batch` with its pending inputs
        naming their carried rows; its launched graph or None; the read-back of the pending
        step's tokens, if any, into a list of its own: taken once the step is launched, beside
        the GPU's first piece)."""
        pending, self._pending = self._pending, None
        launched, self._launched = self._launched, None
        if launched is not None:  # its rows were resolved when it was launched
            batch = launched.batch
        elif pending is not None:
            batch = with_carried(batch, rows_of(pending))
        return batch, launched.graph if launched else None, PendingRead(self.outputs, pending)

    def _complete(self, step: StepResult) -> None:
        """The scheduler told which chunks ran (a chunk may pass the layers over several steps,
        layered_prefill.py: it completes, and samples, in the step its pass ends)."""
        self.scheduler.complete(step.completed)
        if step.deferred is not None:
            self.scheduler.defer(step.deferred)
        self._expert_layers["stream"] += step.streamed_layers
        self._expert_layers["cpu"] += step.cpu_layers

    def _sample(self, step: StepResult, earlier: list[StepOutput], ahead: Ahead | None
                ) -> list[StepOutput]:
        """The step's tokens for its requests still running (`earlier` holds the pending step's
        outputs, read back during it): read back now, or, where the next batch was scheduled
        `ahead` with them pending (its inputs the carried ids, row i for this batch's chunk i,
        where Ahead had them decided), left pending until it runs (-> [])."""
        if ahead is None:
            return self.outputs.finish(self._launch_picks(
                [c.request for c in step.completed if c.samples], earlier, step.logits,
                step.picks))
        # its requests were counted pending when the next batch was scheduled (Ahead)
        assert ahead.sampled.carried, "a step scheduled ahead picks into the carried ids"
        self._pending = ahead.sampled
        return []

    def _launch_picks(self, requests: list[Request], earlier: list[StepOutput],
                      logits: torch.Tensor, picks, carry: bool = False) -> LaunchedOutputs:
        """The tokens of `requests` (logits' rows; picks: a graph's greedy picks or None)
        decided on the device, not waited for, for those still running (none ended in
        `earlier`); carry: each into the runner's carried ids at its row."""
        ended = {id(o.request) for o in earlier if o.status is not RequestStatus.RUNNING}
        live = [i for i, r in enumerate(requests) if id(r) not in ended and not r.is_finished]
        logits, requests, picks = live_rows(logits, requests, picks, live)
        return self.outputs.launch(logits, requests,
                                   self.runner.carried_ids if carry else None, picks, live)

    def _may_launch_ahead(self, batch: ScheduledBatch) -> bool:
        """Whether the next step may be scheduled and launched while this one's CPU experts
        run: this one is a decode of requests past their first token, whose tokens the device
        decides into the carried ids the next reads."""
        chunks = batch.chunks
        live = [c.request for c in chunks if not c.request.is_finished]
        return (self.overlap and self.runner.launches_ahead and bool(live)
                and self.runner.job is None
                and all(len(c.token_ids) == 1 and not c.request.is_prefilling for c in chunks)
                and all(r.num_output_tokens for r in live))

    def _read_back(self) -> list[StepOutput]:
        """The pending step's tokens (for its requests not finished since), if there is one."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        with self.runner.on_stream():
            return self.outputs.finish(pending)

    def retire(self, request: Request, status: RequestStatus) -> None:
        """Finish a running request and free its pages now."""
        self.outputs.drop(request)
        self.runner.drop_job(request)
        self.scheduler.finish(request, status)

    def abandon_in_flight(self) -> list[Request]:
        """After a failed step: the requests whose chunk was part-way through the layers (their
        pass is lost with the step's state) or whose token was pending, for the caller to fail
        too. A step launched ahead is run to its end first (its graph waits for its CPU
        experts), its tokens dropped."""
        self.runner.drop_job()
        self._pending, launched, self._launched = None, self._launched, None
        if launched is not None:
            try:
                with self.runner.on_stream():
                    self.runner.run(launched.batch, launched=launched.graph)
            except Exception:  # the step already failed; its cause is logged
                log.exception("the step launched ahead of a failed one failed too")
        lost = [r for r in self.scheduler.running if r.in_flight or r.num_pending]
        for r in lost:
            r.num_pending = 0
        return lost


def _for_transformers_runner(config: EngineConfig) -> EngineConfig:
    """`config` as TransformersRunner runs it: no paged prefix cache in the scheduler (the
    runner keeps whole caches instead), cache_lens (the tokens admitted at once)
    DEFAULT_CACHE_LENS where left open."""
    from hybrid.model.kv_budget import DEFAULT_CACHE_LENS

    return replace(config, prefix_cache=False,
                   cache_lens=config.cache_lens or DEFAULT_CACHE_LENS)


def _with_cache_lens(config: EngineConfig, loaded) -> EngineConfig:
    """`config` with cache_lens chosen where it is left open (model/kv_budget.py): from the memory
    free on the attention layers' GPU now, after the weights loaded."""
    if config.cache_lens is not None:
        return config
    from hybrid.engine.runner.runner_start_up import attention_ops
    from hybrid.engine.step.kv_cache import PagedLatentCache
    from hybrid.model.kv_budget import auto_cache_lens

    ops = attention_ops(loaded.model)
    device = ops[0].device
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    tokens = auto_cache_lens(loaded.spec.context_length, PagedLatentCache.bytes_for(ops, 1), free,
                             config.page_size)
    return replace(config, cache_lens=tokens)


def _waiter(jobs: list, progress: Callable[[str], None] | None) -> Callable[[], None]:
    """A call that waits for the background compiles `jobs` (cpu_kernels.runtime.precompile)
    the first time, and returns at once after. A process that failed is logged: the warm-up
    then compiles its kernels itself (slower, not wrong)."""
    pending = list(jobs)

    def wait() -> None:
        if pending and progress is not None:
            progress("waiting for the CPU experts' kernels compiling in the background")
        while pending:
            job = pending.pop()
            codes = job.wait()
            if any(c != 0 for c in codes):
                log.warning("a background compile of the CPU experts' kernels (types %s) "
                            "exited %s; start-up compiles them itself", job.types, codes)
    return wait


def _start_cpu_pool(model, threads: int | None):
    """The persistent kernel threads (--cpu-threads) that every CPU experts layer runs on."""
    from cpu_kernels import MoEPool
    from hybrid.ops.experts import use_cpu_pool

    try:
        pool = MoEPool(threads=threads)
    except ValueError as e:
        raise HybridError(f"--cpu-threads {threads}: {e}") from None
    use_cpu_pool(model, pool)
    return pool
