"""From a step's logits to each request's StepOutput: the grammars' masks, the batch's sampled
tokens (sampling/sampler.py), then per request its text delta, stop strings and finish reason.
`launch` decides the tokens on the device and `finish` reads them back, so that the engine may
run its next step between the two (overlapped decode); `step` is both at once.

Holds each running request's output state (its random generator, incremental detokenizer,
stop-string checker, grammar matcher and penalty inputs) from its first sampled token until it
is dropped.
A failure of one request's own (its draw, its detokenizer, grammar or stop strings) fails that
request alone, with the cause: the others of the step go on. A lost device is never caught.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from hybrid.engine.sampling.grammar import GrammarVocab, Matcher, mask_logits
from hybrid.engine.sampling.penalties import PenaltyState
from hybrid.engine.sampling.sampler import (
    LaunchedSamples,
    Sampled,
    launch_samples,
    make_generator,
)
from hybrid.engine.sampling.sampling_params import StopChecker
from hybrid.engine.scheduling.request import Request, RequestFailed, RequestStatus, TokenOutput
from hybrid.errors import is_device_lost
from hybrid.tokenizer.gguf_tokenizer import IncrementalDetokenizer

log = logging.getLogger("hybrid.engine")


@dataclass
class OutputState:
    generator: torch.Generator
    detokenizer: IncrementalDetokenizer
    stops: StopChecker
    matcher: Matcher | None = None  # structured output: where the request is in its grammar
    penalties: PenaltyState | None = None  # made at its first sampled token, if it has any


@dataclass(frozen=True)
class StepOutput:
    """One request's new token from a step, and its status after that token; or, status
    FINISHED_FAILED, why the request failed in this step (the others went on)."""

    request: Request
    token: TokenOutput | RequestFailed
    status: RequestStatus


@dataclass(frozen=True)
class LaunchedOutputs:
    """A step's picks for `requests`: on their way from the device (LaunchedSamples, or a
    graph's greedy picks: anything with `result() -> list[Sampled]`), or, where the batch
    failed and each request was sampled alone, already on the host."""

    requests: list[Request]
    states: list[OutputState]
    picks: object
    rows: list[int] | None = None  # each request's row of the device's carried ids

    @property
    def carried(self) -> bool:
        """Whether the picks went to the device's carried ids (rows says where)."""
        return self.rows is not None


class PendingRead:
    """A pending step's tokens read back in two parts. `take` copies its picks off the device's
    buffers: before the step after it drives its CPU experts, since that step's graph
    rewrites them after its last MoE layer (graphs/device_picks.py). `finish` makes their
    StepOutputs (detokenizing, stop strings, a grammar's matcher) into `into`, once: it may
    run on the thread beside the CPU experts, off the step's critical path."""

    def __init__(self, outputs: RequestOutputs, pending: LaunchedOutputs | None) -> None:
        self.outputs, self.pending = outputs, pending
        self.into: list[StepOutput] = []  # the pending step's outputs, once finished

    def take(self) -> None:
        p = self.pending
        if p is not None and not isinstance(p.picks, list):
            self.pending = replace(p, picks=p.picks.result())

    def finish(self) -> None:
        """Both parts (`take` first where it has not run); later calls do nothing."""
        self.take()
        pending, self.pending = self.pending, None
        if pending is not None:
            self.into.extend(self.outputs.finish(pending))


class RequestOutputs:
    def __init__(self, tokenizer, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._states: dict[int, OutputState] = {}  # id(request) -> its output state
        self._grammar_vocab: GrammarVocab | None = None  # built on the first grammar request

    def state(self, r: Request) -> OutputState:
        state = self._states.get(id(r))
        if state is None:
            state = self._states[id(r)] = OutputState(
                make_generator(r.params),
                IncrementalDetokenizer(self.tokenizer, r.params.skip_special_tokens),
                StopChecker(r.params.stop), self._matcher(r.params.grammar))
        return state

    def drop(self, r: Request) -> None:
        """Forget a retired or cancelled request's state."""
        self._states.pop(id(r), None)

    def step(self, logits: torch.Tensor, requests: list[Request]) -> list[StepOutput]:
        """logits: [R, V] on the model's device, row i for requests[i] (masked in place where a
        request has a grammar) -> each request's StepOutput, in order."""
        return self.finish(self.launch(logits, requests))

    def launch(self, logits: torch.Tensor, requests: list[Request],
               carry: torch.Tensor | None = None, picked=None, rows: list[int] | None = None
               ) -> LaunchedOutputs:
        """The picks of `step`, decided on the device and not waited for. carry: int64 on the
        device whose row rows[i] gets requests[i]'s pick (where the batch launched as one;
        rows default to 0..R-1); picked: the rows' greedy picks made already, into the carried
        ids at their rows (graphs/device_picks.py's StepPicks), taken where every request
        decodes greedily and asks for nothing else of its logits."""
        states = [self.state(r) for r in requests]
        if picked is not None and all(_greedy_only(r, s) for r, s in zip(requests, states)):
            return LaunchedOutputs(requests, states, picked, picked.rows)
        rows = list(range(len(requests))) if rows is None else rows
        try:
            picks = self._pick(logits, requests, states, carry, rows)
        except Exception as e:  # one request's trouble: find it, fail it alone
            if is_device_lost(e) or len(requests) < 2:
                raise
            log.warning("sampling a step's %d requests failed (%s); each alone", len(requests), e)
            picks = [self._alone(logits[i:i + 1], r, s) for i, (r, s)
                     in enumerate(zip(requests, states, strict=True))]
        carried = carry is not None and isinstance(picks, LaunchedSamples)
        return LaunchedOutputs(requests, states, picks, rows if carried else None)

    def finish(self, launched: LaunchedOutputs) -> list[StepOutput]:
        """The launched picks read back -> the StepOutput of each request not finished since
        (one cancelled meanwhile has none), in order."""
        picks = launched.picks
        if not isinstance(picks, list):
            picks = picks.result()
        out = []
        for r, s, pick in zip(launched.requests, launched.states, picks, strict=True):
            r.num_pending = 0
            if not r.is_finished:
                out.append(self._output(r, s, pick))
        return out

    def _pick(self, logits: torch.Tensor, requests: list[Request], states: list[OutputState],
              carry: torch.Tensor | None = None, rows: list[int] | None = None
              ) -> LaunchedSamples:
        if any(s.matcher is not None for s in states):
            mask_logits(logits, [s.matcher for s in states])
        for r, s in zip(requests, states, strict=True):
            if s.penalties is None and r.params.has_penalties:
                s.penalties = PenaltyState(r.prompt_ids, logits.shape[1], logits.device)
        return launch_samples(logits, [(r.params, s.generator, r.prompt_ids, r.output_ids)
                                       for r, s in zip(requests, states, strict=True)],
                              [s.penalties for s in states], carry, rows)

    def _alone(self, row: torch.Tensor, r: Request, s: OutputState) -> Sampled | RequestFailed:
        try:
            return self._pick(row, [r], [s]).result()[0]
        except Exception as e:  # noqa: BLE001 (_own_failure raises a lost device again)
            return _own_failure(e, r, "sampling")

    def _output(self, r: Request, s: OutputState, pick: Sampled | RequestFailed) -> StepOutput:
        if isinstance(pick, RequestFailed):
            return StepOutput(r, pick, RequestStatus.FINISHED_FAILED)
        try:
            return self._next_token(r, s, pick)
        except Exception as e:  # noqa: BLE001 (_own_failure raises a lost device again)
            return StepOutput(r, _own_failure(e, r, f"its token {pick.token_id}"),
                              RequestStatus.FINISHED_FAILED)

    @property
    def grammar_vocab(self) -> GrammarVocab:
        """The tokenizer as the grammars see it, built at the first use and kept."""
        if self._grammar_vocab is None:
            t = self.tokenizer
            self._grammar_vocab = GrammarVocab(t.hf_json(), self.vocab_size, t.eos_token_id)
        return self._grammar_vocab

    def _matcher(self, grammar: str | None) -> Matcher | None:
        return None if grammar is None else self.grammar_vocab.matcher(grammar)

    def _next_token(self, r: Request, state: OutputState, s: Sampled) -> StepOutput:
        p = r.params
        r.append(s.token_id)
        delta = state.detokenizer.push(s.token_id)
        finished = None
        if (s.token_id == self.tokenizer.eos_token_id and not p.ignore_eos) \
                or s.token_id in p.stop_token_ids:
            finished = "stop"
        if state.matcher is not None and (not state.matcher.accept(s.token_id)
                                          or state.matcher.done):
            finished = "stop"  # the structured output is complete
        delta, hit = state.stops.feed(delta)
        if hit:
            finished = "stop"
        elif r.num_output_tokens >= r.max_tokens:
            finished = finished or "length"
        if finished is not None and not hit:
            delta += state.stops.feed(state.detokenizer.flush(), final=True)[0]
        token = TokenOutput(s.token_id, delta, s.logprob, tuple(s.top_logprobs), finished,
                            r.num_cached_tokens)
        status = RequestStatus.RUNNING if finished is None else RequestStatus(finished)
        return StepOutput(r, token, status)


def _greedy_only(r: Request, s: OutputState) -> bool:
    """Whether the request's next token is its logits' argmax and it reports at most that
    token's log-probability (what a graph's greedy picks give)."""
    p = r.params
    return (p.is_greedy and not p.has_penalties and s.matcher is None and not p.logprobs
            and len(r.output_ids) >= len(p.forced_ids))


def _own_failure(e: Exception, r: Request, what: str) -> RequestFailed:
    """The failure of `r` alone, for its client; a lost device is raised again, for the
    worker to fail everything."""
    if is_device_lost(e):
        raise e
    log.exception("request %s: %s failed", r.request_id, what)
    return RequestFailed(f"generation failed: {type(e).__name__}: {e}")
