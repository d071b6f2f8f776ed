"""`hybrid.LLM`: offline generation in the style of vLLM's `LLM.generate`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from hybrid.engine.model_runner import SequenceRunner
from hybrid.engine.sampler import Sampled, make_generator, sample
from hybrid.engine.sampling_params import SamplingParams
from hybrid.errors import HybridError
from hybrid.model.loader import LoadedModel, load_with_rules
from hybrid.tokenizer.detokenizer import IncrementalDetokenizer


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


@dataclass(frozen=True)
class StreamEvent:
    """One generated token: its id, the text it completes, and whether the sequence ended."""

    sampled: Sampled
    text_delta: str
    finish_reason: str | None


class LLM:
    """Load a DeepSeek GGUF with optimize rules and generate from it.

    `gguf_path` None builds (once) and uses the built-in demo model. `optimize_rules` is a
    bundled rule file name or a path; None picks the machine's default (and says which).
    `device_map` remaps rule devices (e.g. {"cuda": "cpu"}) for dry runs and tests.
    """

    def __init__(self, gguf_path: str | None = None, optimize_rules: str | None = None,
                 device_map: dict[str, str] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        if gguf_path is None:
            from hybrid.demo import demo_model_path

            gguf_path = str(demo_model_path())
        self.loaded: LoadedModel = load_with_rules(gguf_path, optimize_rules, device_map, progress)
        self.tokenizer = self.loaded.tokenizer

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or token ids via `prompt_token_ids`)."""
        params = sampling_params or SamplingParams()
        if (prompts is None) == (prompt_token_ids is None):
            raise HybridError("pass either prompts or prompt_token_ids")
        if isinstance(prompts, str):
            prompts = [prompts]
        requests: list[tuple[str | None, list[int]]]
        if prompts is not None:
            requests = [(p, self.tokenizer.encode(p)) for p in prompts]
        else:
            requests = [(None, list(ids)) for ids in prompt_token_ids or []]
        results = []
        for prompt, ids in requests:
            results.append(RequestOutput(prompt, ids, [self._complete(ids, params)]))
        return results

    def _complete(self, prompt_ids: list[int], params: SamplingParams) -> CompletionOutput:
        tokens, logprobs, tops, text, reason = [], [], [], "", "length"
        for event in self.stream(prompt_ids, params):
            tokens.append(event.sampled.token_id)
            logprobs.append(event.sampled.logprob)
            tops.append(list(event.sampled.top_logprobs))
            text += event.text_delta
            reason = event.finish_reason or reason
        want = params.logprobs is not None
        return CompletionOutput(text, tokens, logprobs if want else None,
                                tops if want else None, reason)

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[StreamEvent]:
        """Generate token by token; stop strings never appear in the text deltas."""
        self._check_prompt(prompt_ids)
        runner = SequenceRunner(self.loaded.model)
        generator = make_generator(params)
        detok = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        stops = StopChecker(params.stop)
        eos = self.tokenizer.eos_token_id
        logits = runner.forward(prompt_ids)
        for step in range(params.max_tokens):
            s = sample(logits, params, generator)
            delta = detok.push(s.token_id)
            finished = None
            if (s.token_id == eos and not params.ignore_eos) or s.token_id in params.stop_token_ids:
                finished = "stop"
            delta, hit = stops.feed(delta)
            if hit:
                finished = "stop"
            elif step == params.max_tokens - 1:
                finished = finished or "length"
            if finished is not None and not hit:
                delta += stops.feed(detok.flush(), final=True)[0]
            yield StreamEvent(s, delta, finished)
            if finished is not None:
                return
            logits = runner.forward([s.token_id])

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise HybridError("the prompt is empty; give at least one token")
        vocab = self.loaded.spec.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise HybridError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        limit = self.loaded.spec.context_length
        if len(ids) >= limit:
            raise HybridError(f"the prompt has {len(ids)} tokens; the model's context is {limit}")


class StopChecker:
    """Holds back text that could be the start of a stop string, so none ever leaks out."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was found)."""
        if not self.stops:
            return delta, False
        buf = self.pending + delta
        cut = min((buf.find(s) for s in self.stops if s in buf), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        if final:
            self.pending = ""
            return buf, False
        keep = max((_overlap(buf, s) for s in self.stops), default=0)
        self.pending = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
