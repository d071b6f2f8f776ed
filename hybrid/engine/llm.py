"""`hybrid.LLM`: offline generation in the style of vLLM's `LLM.generate`.

It drives the same engine the server runs (continuous batching over the paged KV cache), from
the caller's thread: `generate()` submits every prompt at once and steps until all are done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hybrid.engine.config import EngineConfig
from hybrid.engine.engine import Engine
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import Request, RequestEvent, RequestFailed, TokenOutput
from hybrid.engine.worker import EngineWorker
from hybrid.errors import HybridError
from hybrid.model.kv_budget import DEFAULT_CACHE_LENS
from hybrid.model.loader import LoadedModel
from hybrid.rules.load import load_with_rules


@dataclass
class CompletionOutput:
    text: str
    token_ids: list[int]
    logprobs: list[float] | None  # the chosen token's log-probability, one per token
    top_logprobs: list[list[tuple[int, float]]] | None
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class LLM:
    """Load a DeepSeek GGUF with optimize rules and generate from it.

    `gguf_path` None builds (once) and uses the built-in demo model. `optimize_rules` is a
    bundled rule file name or a path; None picks the machine's default (and says which).
    `device_map` remaps rule devices (e.g. {"cuda": "cpu"}) for dry runs and tests.
    `progress` hears loading (bytes done, bytes in all); `status` what start-up does after loading (kernel
    warm-up, CUDA graph capture), one line each.
    """

    def __init__(self, gguf_path: str | None = None, optimize_rules: str | None = None,
                 device_map: dict[str, str] | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 engine_config: EngineConfig | None = None,
                 status: Callable[[str], None] | None = None) -> None:
        if gguf_path is None:
            from hybrid.demo import demo_model_path

            gguf_path = str(demo_model_path())
        config = engine_config or EngineConfig()
        if device_map is None and config.device_map:
            from hybrid.rules.devices import parse_device_map

            device_map = parse_device_map(config.device_map)
        # the plan is checked against the GPUs with the KV cache this engine will allocate
        self.loaded: LoadedModel = load_with_rules(gguf_path, optimize_rules, device_map, progress,
                                                   cache_lens=config.cache_lens
                                                   or DEFAULT_CACHE_LENS,
                                                   packed_cache=config.packed_cache)
        self.tokenizer = self.loaded.tokenizer
        self.engine = Engine(self.loaded, config, status)
        # Unstarted: this object steps it. The server starts it as its background thread.
        self.worker = EngineWorker(self.engine)
        self._next_id = 0

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or token ids via `prompt_token_ids`), all in one batch;
        `sampling_params` is one for all or one per prompt (as in vLLM)."""
        if (prompts is None) == (prompt_token_ids is None):
            raise HybridError("pass either prompts or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompts is not None:
            jobs = [(p, self.tokenizer.encode(p)) for p in prompts]
        else:
            jobs = [(None, list(ids)) for ids in prompt_token_ids or []]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            each = [sampling_params or SamplingParams()] * len(jobs)
        else:
            each = list(sampling_params)
            if len(each) != len(jobs):
                raise HybridError(f"{len(each)} sampling params for {len(jobs)} prompts")
        self._check_idle()
        events: list[list[TokenOutput]] = [[] for _ in jobs]
        requests = [self._submit(ids, p, events[i].append)
                    for i, ((_, ids), p) in enumerate(zip(jobs, each))]
        while any(not r.is_finished for r in requests):
            self.worker.step()
        return [RequestOutput(p, ids, [_completion(ev, params)])
                for (p, ids), ev, params in zip(jobs, events, each)]

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[TokenOutput]:
        """Generate token by token; stop strings never appear in the text deltas."""
        self._check_idle()
        events: list[RequestEvent] = []
        request = self._submit(list(prompt_ids), params, events.append)
        try:
            while events or not request.is_finished:
                if not events:
                    self.worker.step()
                    continue
                event = events.pop(0)
                if isinstance(event, RequestFailed):
                    raise HybridError(event.message)
                yield event
        finally:
            if not request.is_finished:  # the caller stopped reading: free its pages
                self.worker.cancel(request)
                self.worker.step()

    def _check_idle(self) -> None:
        if self.worker.has_work:
            raise HybridError("this LLM is already generating (one generate/stream at a time)")

    def _submit(self, ids: list[int], params: SamplingParams, sink) -> Request:
        self._next_id += 1
        request = Request(f"offline-{self._next_id}", ids, params, sink)
        self.worker.submit(request)
        return request


def _completion(events: list[RequestEvent], params: SamplingParams) -> CompletionOutput:
    failed = next((e for e in events if isinstance(e, RequestFailed)), None)
    if failed is not None:
        raise HybridError(failed.message)
    want = params.logprobs is not None
    return CompletionOutput(
        "".join(e.text for e in events), [e.token_id for e in events],
        [e.logprob for e in events] if want else None,
        [list(e.top_logprobs) for e in events] if want else None,
        events[-1].finish_reason or "length" if events else "length")
