"""The batched draw (hybrid/engine/sampling/draw.py) against its reference, sampler.sampling_probs,
and sample_batch's rows: greedy, forced, penalized and drawn rows side by side in one batch."""

from __future__ import annotations

import pytest
import torch

from hybrid.engine.sampling import draw as draw_module
from hybrid.engine.sampling.draw import draw
from hybrid.engine.sampling.penalties import PenaltyState, batch_penalties
from hybrid.engine.sampling.sampler import (
    apply_penalties,
    make_generator,
    sample,
    sample_batch,
    sampling_probs,
)
from hybrid.engine.sampling.sampling_params import SamplingParams

GRID = 4000  # uniforms a row: a token's share of them is its probability within 1 / GRID


def random_params(g: torch.Generator, vocab: int) -> SamplingParams:
    u = torch.rand(6, generator=g).tolist()
    kind = int(torch.randint(0, 5, (1,), generator=g))  # a mix of filters
    return SamplingParams(
        temperature=0.2 + 1.8 * u[0],
        min_p=0.2 * u[1] if kind in (1, 4) else 0.0,
        top_k=int(1 + u[2] * vocab * 1.2) if kind in (2, 4) else 0,
        top_p=0.3 + 0.7 * u[3] if kind in (3, 4) else 1.0)


@pytest.mark.parametrize("candidates", [3, 1024])
@pytest.mark.parametrize("seed", range(8))
def test_each_rows_draws_follow_the_reference(seed: int, candidates: int,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of a mixed batch: over a grid of uniforms, each token is drawn for its
    reference probability's share of them; with 3 candidates most top_p rows take the
    whole-row sort."""
    monkeypatch.setattr(draw_module, "CANDIDATES", candidates)
    g = torch.Generator().manual_seed(seed)
    vocab = int(torch.randint(5, 60, (1,), generator=g))
    rows = 6
    scores = torch.randn(rows, vocab, generator=g) * 3  # [S, V]
    params = [random_params(g, vocab) for _ in range(rows)]
    u = (torch.arange(GRID, dtype=torch.float64) + 0.5) / GRID  # [G]
    tokens = draw(scores.repeat_interleave(GRID, 0), [p for p in params for _ in range(GRID)],
                  u.repeat(rows)).view(rows, GRID)
    for i, p in enumerate(params):
        want = sampling_probs(scores[i], p)  # [V]
        got = torch.bincount(tokens[i], minlength=vocab).double() / GRID
        assert (got - want.double()).abs().max() <= 1.0 / GRID + 1e-5, p


def test_a_draw_never_takes_a_dropped_token() -> None:
    scores = torch.tensor([[5.0, 4.0, -30.0, -30.0, -30.0, 3.0]])
    params = [SamplingParams(temperature=1.0, top_k=2)]
    for u in (0.0, 1e-12, 0.5, 1 - 1e-16, float(torch.nextafter(torch.tensor(1.0),
                                                                 torch.tensor(0.0)))):
        assert int(draw(scores, params, torch.tensor([u], dtype=torch.float64))) in (0, 1)


def test_large_vocabularies_use_the_candidates() -> None:
    """A peaked row under top_p stays inside the candidates; a flat one needs the whole row:
    both follow the reference."""
    g = torch.Generator().manual_seed(0)
    vocab = 3000
    peaked, flat = torch.randn(vocab, generator=g) * 6, torch.randn(vocab, generator=g) * 0.01
    params = SamplingParams(temperature=1.0, top_p=0.9)
    u = (torch.arange(GRID, dtype=torch.float64) + 0.5) / GRID
    for row in (peaked, flat):
        tokens = draw(row.repeat(GRID, 1), [params] * GRID, u)
        got = torch.bincount(tokens, minlength=vocab).double() / GRID
        assert (got - sampling_probs(row, params).double()).abs().max() <= 1.0 / GRID + 1e-5


@pytest.mark.parametrize("seed", range(4))
def test_sorting_every_row_whole_draws_the_same_tokens(seed: int) -> None:
    """A GPU's draw sorts every top_k/top_p row whole beside its candidates instead of asking
    which rows the candidates cover (a wait for the device): the same tokens, row for row."""
    g = torch.Generator().manual_seed(seed)
    vocab, rows = 3000, 24
    scale = torch.where(torch.rand(rows, 1, generator=g) < 0.5, 6.0, 0.01)  # peaked and flat
    scaled = torch.randn(rows, vocab, generator=g) * scale  # [R, V]
    params = [random_params(g, vocab) for _ in range(rows)]
    table = torch.tensor([[p.temperature, p.min_p, p.top_k if 0 < p.top_k < vocab else 0,
                           p.top_p] for p in params])  # [R, 4], as draw builds it
    u = torch.rand(rows, dtype=torch.float64, generator=g)
    for most in (16, 256):
        asked = draw_module._ranked(scaled, table, u, most, sort_all=False)
        assert torch.equal(draw_module._ranked(scaled, table, u, most, sort_all=True), asked)


def test_a_mixed_batch_decides_each_row_as_its_request_asks() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 50, generator=g) * 2  # [R, V]
    greedy = SamplingParams(temperature=0, logprobs=3)
    penalized = SamplingParams(temperature=0, presence_penalty=2.0, logprobs=0)
    forced = SamplingParams(temperature=1.0, forced_ids=(7, 8))
    drawn = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    history = [int(logits[1].argmax())]
    rows = [(greedy, make_generator(greedy), [1], []),
            (penalized, make_generator(penalized), [1], history),
            (forced, make_generator(forced), [1], [7]),
            (drawn, make_generator(drawn), [1], []),
            (greedy, make_generator(greedy), [1], [2, 3])]
    picks = sample_batch(logits, rows)
    ref = [sample(logits[i], p, make_generator(p), prompt, out)
           for i, (p, _, prompt, out) in enumerate(rows)]
    for i in (0, 1, 4):  # decided without a draw: equal to the one-row reference
        assert picks[i].token_id == ref[i].token_id
        assert picks[i].logprob == pytest.approx(ref[i].logprob, abs=1e-5)
        assert [t for t, _ in picks[i].top_logprobs] == [t for t, _ in ref[i].top_logprobs]
    assert picks[1].token_id != history[0]  # the presence penalty moved it
    assert picks[2].token_id == 8 and picks[2].top_logprobs == ()
    raw = torch.log_softmax(logits[2], -1)
    assert picks[2].logprob == pytest.approx(float(raw[8]), abs=1e-5)
    assert sampling_probs(logits[3], drawn)[picks[3].token_id] > 0


def test_a_seeded_request_draws_the_same_tokens_in_any_batch() -> None:
    g = torch.Generator().manual_seed(2)
    steps = [torch.randn(3, 40, generator=g) for _ in range(12)]  # [R, V] a step
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=11)
    other = SamplingParams(temperature=0.7)

    def run(rows_before: int) -> list[int]:
        gen, others = make_generator(seeded), [make_generator(other) for _ in range(2)]
        out = []
        for logits in steps:
            rows = [(other, gen_o, [], []) for gen_o in others[:rows_before]]
            rows.append((seeded, gen, [], out))
            out.append(sample_batch(logits[-len(rows):], rows)[-1].token_id)
        return out
    assert run(0) == run(2)


def test_penalties_on_a_device_tensor_keep_its_device() -> None:
    logits = torch.tensor([1.0, 3.0, 2.8, 0.0])
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.2)
    got = apply_penalties(logits, params, [1], [1, 2])
    assert got.device == logits.device and got.shape == logits.shape


@pytest.mark.parametrize("seed", range(6))
def test_batched_penalties_equal_each_rows(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    vocab, rows = int(torch.randint(5, 50, (1,), generator=g)), 5
    logits = torch.randn(rows, vocab, generator=g) * 3  # [P, V]
    params, prompts, outputs = [], [], []
    for i in range(rows):
        u = torch.rand(3, generator=g).tolist()
        params.append(SamplingParams(
            repetition_penalty=0.5 + 1.5 * u[0] if i % 2 else 1.0,
            frequency_penalty=4 * u[1] - 2 if i % 3 else 0.0, presence_penalty=4 * u[2] - 2))
        prompts.append(torch.randint(0, vocab, (int(torch.randint(0, 9, (1,), generator=g)),),
                                     generator=g).tolist())
        outputs.append(torch.randint(0, vocab, (int(torch.randint(0, 12, (1,), generator=g)),),
                                     generator=g).tolist())
    # states grown a token at a time, as the engine's are, equal states made at once
    grown = [PenaltyState(prompts[i], vocab, logits.device) for i in range(rows)]
    for i, out in enumerate(outputs):
        for n in range(len(out) + 1):
            grown[i].sync(out[:n])
    got = batch_penalties(logits, params, grown)
    fresh = batch_penalties(logits, params, [PenaltyState(a, vocab, logits.device).sync(b)
                                             for a, b in zip(prompts, outputs, strict=True)])
    assert torch.equal(got, fresh)
    for i in range(rows):
        want = apply_penalties(logits[i], params[i], prompts[i], outputs[i])
        assert got[i].tolist() == pytest.approx(want.tolist(), abs=1e-6)


def test_no_row_of_a_batch_is_sampled_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of row stays in the batched path: the one-row host sampler (the reference)
    is never called from sample_batch."""
    from hybrid.engine.sampling import sampler

    def refuse(*args, **kwargs):
        raise AssertionError("a row went to the host sampler")
    monkeypatch.setattr(sampler, "sample", refuse)
    kinds = [SamplingParams(temperature=0), SamplingParams(temperature=0.6, top_p=0.95),
             SamplingParams(temperature=0.8, top_k=40, repetition_penalty=1.1),
             SamplingParams(temperature=1.0, min_p=0.1, frequency_penalty=0.5),
             SamplingParams(temperature=0.7, forced_ids=(3,), logprobs=2)]
    logits = torch.randn(len(kinds), 64)
    picks = sample_batch(logits, [(p, make_generator(p), [1, 2], []) for p in kinds])
    assert len(picks) == len(kinds) and picks[4].token_id == 3


def test_hostile_temperatures_and_nan_logits_never_fail_the_batch() -> None:
    """A temperature that overflows float32 (1e-40) is greedy; a row of NaN logits still
    yields an id in range; neither takes the other rows of the batch down with it."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 80, generator=g) * 5
    logits[3] = float("nan")
    kinds = [SamplingParams(temperature=1e-40), SamplingParams(temperature=1e-30, top_p=0.5),
             SamplingParams(temperature=1e30, top_k=5), SamplingParams(temperature=0.7, top_p=0.9)]
    picks = sample_batch(logits, [(p, make_generator(p), [], []) for p in kinds])
    assert [p.token_id for p in picks[:2]] == [int(logits[0].argmax()), int(logits[1].argmax())]
    assert picks[2].token_id in set(logits[2].topk(5).indices.tolist())
    assert 0 <= picks[3].token_id < 80
