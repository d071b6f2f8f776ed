"""A serving request: what was asked, what has been generated, and where it stands.

Imports no torch: scheduling code works on plain ids and flags. The worker thread is the only
writer of a request's counters; any thread may call `cancel()`.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hybrid.engine.sampling.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"  # EOS, a stop token or a stop string
    FINISHED_LENGTH = "length"  # max_tokens reached
    FINISHED_CANCELLED = "cancelled"  # the client went away (or asked to stop)
    FINISHED_FAILED = "failed"  # the model raised; the message went to the sink

    @property
    def is_finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING)


@dataclass(frozen=True)
class TokenOutput:
    """One generated token, as sent to the request's sink."""

    token_id: int
    text: str  # the text this token completes; stop strings are never part of it
    logprob: float  # the chosen token's log-probability under the model
    top_logprobs: tuple[tuple[int, float], ...]  # (id, logprob), best first; () unless asked
    finish_reason: str | None  # "stop" or "length" on the request's last token, else None
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache already held


@dataclass(frozen=True)
class RequestFailed:
    """The request ended with an error; `message` is safe to show the client."""

    message: str


RequestEvent = TokenOutput | RequestFailed
Sink = Callable[[RequestEvent], None]  # called from the worker thread; must not block


@dataclass(eq=False)
class Request:
    """One sequence to generate. `sink` receives each TokenOutput, or one RequestFailed."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sink: Sink
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None
    # Set by the scheduler at admission: the KV pages this request holds, how many of its
    # tokens (prompt then outputs) have their KV computed, and its max_tokens after clamping
    # to what the cache and the model's context can hold.
    page_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, found in the prefix cache at admission
    max_tokens: int = 0
    # a prompt chunk of this request is part-way through the layers, spread over steps (the
    # model runner's layered prefill): the scheduler gives it nothing more until it is done
    in_flight: bool = False
    # its newest token is sampled but still only on the device (the engine's overlapped
    # decode): the scheduler counts it (1 or 0) in the request's positions and max_tokens
    num_pending: int = 0
    _cancel_requested: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens so far."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < len(self.prompt_ids)

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of prompt + outputs."""
        p = len(self.prompt_ids)
        head = self.prompt_ids[start:min(stop, p)]
        return head + self.output_ids[max(start - p, 0):max(stop - p, 0)]

    @property
    def is_cancel_requested(self) -> bool:
        return self._cancel_requested.is_set()

    def cancel(self) -> None:
        """Ask the worker to drop this request; it does so before the next token (thread-safe)."""
        self._cancel_requested.set()

    def append(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.output_ids.append(token_id)

    def finish(self, status: RequestStatus) -> None:
        assert status.is_finished, status
        self.status = status
        self.finish_time = time.monotonic()
