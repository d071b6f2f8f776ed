"""A torch-free engine for worker and scheduler tests: the real Scheduler, a fake forward.

Each sampled token is the request's newest token + 1; the "model" fails on `fail_on`.
"""

from __future__ import annotations

from hybrid.engine.config import EngineConfig
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import Request, RequestStatus, TokenOutput
from hybrid.engine.scheduling.scheduler import ScheduledBatch, Scheduler


class FakeStepOutput:
    def __init__(self, request: Request, token: TokenOutput, status: RequestStatus) -> None:
        self.request, self.token, self.status = request, token, status


class FakeEngine:
    def __init__(self, config: EngineConfig | None = None, context_length: int = 4096,
                 fail_on: int | None = None, error: Exception | None = None) -> None:
        self.scheduler = Scheduler(config or EngineConfig(cache_lens=4096, page_size=16),
                                   context_length)
        self.fail_on = fail_on
        self.error = error or RuntimeError("boom")  # what the failing forward raises
        self.batches: list[ScheduledBatch] = []
        self.expert_layer_counts = {"stream": 0, "cpu": 0}

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def cached_prompt_tokens(self) -> int:
        return self.scheduler.num_cached_tokens

    def add(self, request: Request) -> None:
        self.scheduler.add(request)

    def schedule(self) -> ScheduledBatch:
        return self.scheduler.schedule()

    def execute(self, batch: ScheduledBatch, schedule_ahead=None) -> list[FakeStepOutput]:
        """Engine.execute's contract without a model (it never schedules ahead)."""
        self.batches.append(batch)
        if any(t == self.fail_on for c in batch.chunks for t in c.token_ids):
            raise self.error
        self.scheduler.complete(batch.chunks)
        outs = []
        for c in batch.chunks:
            if not c.samples:
                continue
            r = c.request
            token = c.token_ids[-1] + 1
            r.append(token)
            done = r.num_output_tokens >= r.max_tokens
            outs.append(FakeStepOutput(r, TokenOutput(token, f"<{token}>", -0.5, (),
                                                      "length" if done else None),
                                       RequestStatus.FINISHED_LENGTH if done
                                       else RequestStatus.RUNNING))
        return outs

    def abandon_in_flight(self) -> list[Request]:
        return []

    def retire(self, request: Request, status: RequestStatus) -> None:
        self.scheduler.finish(request, status)


def make(prompt: list[int], max_tokens: int = 3) -> tuple[Request, list]:
    events: list = []
    return Request(f"r{prompt[0]}", prompt, SamplingParams(max_tokens=max_tokens),
                   events.append), events
