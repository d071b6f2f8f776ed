"""Sampler filters and penalties (against plain references written here), stop strings and
parameter validation."""

from __future__ import annotations

import pytest
import torch

from hybrid.engine.sampling.sampler import apply_penalties, make_generator, sample, sampling_probs
from hybrid.engine.sampling.sampling_params import SamplingParams, StopChecker
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
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\], got 1.5"),
    ({"min_p": -0.1}, "min_p must be in"),
    ({"presence_penalty": 2.5}, "presence_penalty must be between -2 and 2, got 2.5"),
    ({"frequency_penalty": -3}, "frequency_penalty must be between -2 and 2, got -3"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty must be between"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a finite number > 0"),
    ({"repetition_penalty": -1.2}, "repetition_penalty must be a finite number > 0"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty must be a finite number"),
    ({"temperature": float("nan")}, "temperature must be >= 0"),
])
def test_invalid_params(kwargs: dict, message: str) -> None:
    with pytest.raises(HybridError, match=message):
        SamplingParams(**kwargs)


# -- penalties and min_p against plain references ----------------------------------------------


def ref_penalties(logits: list[float], prompt: list[int], output: list[int], presence: float,
                  frequency: float, repetition: float) -> list[float]:
    """vLLM's order, one token at a time: repetition over prompt + output, then OpenAI's
    frequency and presence over the output."""
    out = list(logits)
    for t in set(prompt) | set(output):
        out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
    for t in set(output):
        out[t] -= frequency * output.count(t) + presence
    return out


def ref_probs(scores: list[float], temperature: float, min_p: float, top_k: int,
              top_p: float) -> list[float]:
    import math

    scaled = [s / temperature for s in scores]
    keep = set(range(len(scaled)))

    def softmax(kept: set[int]) -> dict[int, float]:
        m = max(scaled[i] for i in kept)
        e = {i: math.exp(scaled[i] - m) for i in kept}
        z = sum(e.values())
        return {i: v / z for i, v in e.items()}

    if min_p > 0:
        p = softmax(keep)
        top = max(p.values())
        keep = {i for i in keep if p[i] >= min_p * top}
    if top_k > 0:
        keep = set(sorted(keep, key=lambda i: (-scaled[i], i))[:top_k])
    if top_p < 1:
        p = softmax(keep)
        kept, mass = set(), 0.0
        for i in sorted(keep, key=lambda i: -p[i]):
            if mass >= top_p:
                break
            kept.add(i)
            mass += p[i]
        keep = kept
    p = softmax(keep)
    return [p.get(i, 0.0) for i in range(len(scaled))]


@pytest.mark.parametrize("seed", range(12))
def test_penalties_and_filters_equal_the_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    vocab = int(torch.randint(8, 40, (1,), generator=g))
    logits = torch.randn(vocab, generator=g) * 3
    prompt = torch.randint(0, vocab, (int(torch.randint(0, 10, (1,), generator=g)),),
                           generator=g).tolist()
    output = torch.randint(0, vocab, (int(torch.randint(0, 12, (1,), generator=g)),),
                           generator=g).tolist()
    u = torch.rand(7, generator=g).tolist()
    params = SamplingParams(
        temperature=0.3 + 1.5 * u[0], presence_penalty=4 * u[1] - 2,
        frequency_penalty=4 * u[2] - 2, repetition_penalty=0.5 + 1.5 * u[3],
        min_p=0.3 * u[4] if seed % 3 else 0.0, top_k=seed % 4 * 3, top_p=0.5 + 0.5 * u[5])
    scores = apply_penalties(logits, params, prompt, output)
    want = ref_penalties(logits.tolist(), prompt, output, params.presence_penalty,
                         params.frequency_penalty, params.repetition_penalty)
    assert scores.tolist() == pytest.approx(want, abs=1e-5)
    probs = sampling_probs(scores, params)
    ref = ref_probs(want, params.temperature, params.min_p, params.top_k, params.top_p)
    assert probs.tolist() == pytest.approx(ref, abs=1e-5)


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = torch.tensor([2.0, -2.0, 2.0, -2.0, 0.0])
    params = SamplingParams(repetition_penalty=2.0)
    got = apply_penalties(logits, params, prompt_ids=[0], output_ids=[1, 4])
    assert got.tolist() == [1.0, -4.0, 2.0, -2.0, 0.0]


def test_penalties_change_the_greedy_choice_but_not_the_reported_logprob() -> None:
    logits = torch.tensor([1.0, 3.0, 2.8, 0.0])
    raw = torch.log_softmax(logits, -1)
    for kwargs, history, want in [
        ({}, [1, 1], 1),
        ({"presence_penalty": 0.5}, [1], 2),
        ({"frequency_penalty": 0.15}, [1], 1),  # 3 - 0.15 > 2.8: one occurrence is not enough
        ({"frequency_penalty": 0.15}, [1, 1], 2),
        ({"frequency_penalty": -1.0}, [3, 3, 3, 3], 3),  # negative values encourage repeats
        ({"repetition_penalty": 1.2}, [1], 2),
    ]:
        params = SamplingParams(temperature=0, logprobs=1, **kwargs)
        s = sample(logits, params, make_generator(params), prompt_ids=[0], output_ids=history)
        assert s.token_id == want, kwargs
        assert s.logprob == pytest.approx(float(raw[want]))
        assert s.top_logprobs[0][0] == 1  # the raw distribution's best


def test_repetition_penalty_counts_the_prompt_but_presence_does_not() -> None:
    logits = torch.tensor([3.0, 2.9, 0.0])
    rep = SamplingParams(temperature=0, repetition_penalty=1.5)
    pres = SamplingParams(temperature=0, presence_penalty=2.0)
    assert sample(logits, rep, make_generator(rep), prompt_ids=[0]).token_id == 1
    assert sample(logits, pres, make_generator(pres), prompt_ids=[0]).token_id == 0


def test_min_p_restricts_the_support() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    params = SamplingParams(temperature=1.0, min_p=0.25, seed=0)  # keeps p >= 0.125
    gen = make_generator(params)
    assert {sample(logits, params, gen).token_id for _ in range(300)} == {0, 1, 2}
