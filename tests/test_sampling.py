"""Sampler filters, stop strings and parameter validation."""

from __future__ import annotations

import pytest
import torch

from hybrid.engine.llm import StopChecker
from hybrid.engine.sampler import make_generator, sample
from hybrid.engine.sampling_params import SamplingParams
from hybrid.errors import HybridError


def test_greedy_and_logprobs() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 3.0])
    s = sample(logits, SamplingParams(temperature=0, logprobs=2), make_generator(SamplingParams()))
    assert s.token_id == 1  # ties go to the lowest id
    assert s.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[1]))
    assert [t for t, _ in s.top_logprobs] == [1, 3]


@pytest.mark.parametrize("top_k,top_p,allowed", [(2, 1.0, {0, 1}), (0, 0.5, {0}), (0, 0.8, {0, 1})])
def test_filters_restrict_the_support(top_k: int, top_p: float, allowed: set[int]) -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, seed=0)
    gen = make_generator(params)
    seen = {sample(logits, params, gen).token_id for _ in range(300)}
    assert seen == allowed


def test_temperature_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([0.7, 0.2, 0.1]))
    params = SamplingParams(temperature=1.0, seed=123)
    gen = make_generator(params)
    counts = torch.bincount(torch.tensor([sample(logits, params, gen).token_id for _ in range(3000)]),
                            minlength=3)
    assert abs(counts[0] / 3000 - 0.7) < 0.04 and abs(counts[2] / 3000 - 0.1) < 0.03


def test_stop_strings_never_leak_across_tokens() -> None:
    checker = StopChecker(["STOP"])
    pieces = ["Hel", "lo S", "TO", "P and more"]
    emitted, hit = "", False
    for p in pieces:
        text, hit = checker.feed(p)
        emitted += text
        if hit:
            break
    assert hit and emitted == "Hello "


def test_held_back_text_is_released_when_no_stop_follows() -> None:
    checker = StopChecker(["STOP"])
    a, _ = checker.feed("abc ST")
    b, _ = checker.feed("ay")
    c, _ = checker.feed("", final=True)
    assert a + b + c == "abc STay" and a == "abc "


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -1}, "temperature must be >= 0"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"logprobs": 50}, "logprobs must be between 0 and 20"),
    ({"stop": ("",)}, "stop strings must not be empty"),
])
def test_invalid_params(kwargs: dict, message: str) -> None:
    with pytest.raises(HybridError, match=message):
        SamplingParams(**kwargs)
