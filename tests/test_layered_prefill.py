"""A prompt chunk passing the layers over several steps: which chunk is chosen, how many layers
a step, and the scheduler holding its request back until it completes (torch only where a test
imports the step program's piece arithmetic)."""

from __future__ import annotations

from hybrid.engine.config import EngineConfig
from hybrid.engine.prefill.layered_prefill import candidate, layers_per_step
from hybrid.engine.prefill.prefill_costs import ExpertPlacement, PrefillCosts
from hybrid.engine.scheduling.scheduler import Scheduler
from tests.engine_fakes import make

COSTS = PrefillCosts(1, stream_ms=((128, 7.0), (2048, 7.0), (8192, 20.0)),
                     cpu_ms=((1, 0.45), (16, 4.9), (256, 21.0)))


def step_with_decode_and_prompt(prompt_len: int = 100):
    s = Scheduler(EngineConfig(chunk_size=64, cache_lens=1024, page_size=16), 4096)
    short, _ = make([1, 2, 3], 10)
    s.add(short)
    s.complete(s.schedule().chunks)
    short.append(99)
    long, _ = make(list(range(100, 100 + prompt_len)), 5)
    s.add(long)
    return s, short, long, s.schedule()


def test_the_only_prompt_chunk_beside_decodes_when_every_layer_streams() -> None:
    _, _, long, batch = step_with_decode_and_prompt()
    chunk = candidate(batch, ExpertPlacement("stream", (1, 1, 1)), 3)
    assert chunk is not None and chunk.request is long
    assert candidate(batch, ExpertPlacement("cpu", (1, 1, 1)), 3) is None
    # auto: a 64-token chunk streams by these costs (crossover ~50 tokens); 8 would not
    assert candidate(batch, ExpertPlacement("auto", (1, 1, 1), COSTS), 3) is chunk
    _, _, _, small = step_with_decode_and_prompt(8)
    assert candidate(small, ExpertPlacement("auto", (1, 1, 1), COSTS), 3) is None
    alone = type(batch)([chunk], [])  # no decode waits: the step runs it whole
    assert candidate(alone, ExpertPlacement("stream", (1, 1, 1)), 3) is None


def test_layers_per_step_fit_the_prompt_share_of_a_step() -> None:
    # a decode step's CPU experts: 26 x 0.45 = 11.7 ms; a streamed layer 7 ms at 2048 tokens
    assert layers_per_step(ExpertPlacement("auto", (1,) * 26, COSTS), 2048, 26, 1.0) == 1
    assert layers_per_step(ExpertPlacement("auto", (1,) * 26, COSTS), 2048, 26, 2.0) == 3
    assert layers_per_step(ExpertPlacement("auto", (1,) * 60, COSTS), 2048, 60, 1.0) == 3
    # 20 ms a layer at 8192 tokens: 23.4 ms of share holds one
    assert layers_per_step(ExpertPlacement("auto", (1,) * 26, COSTS), 8192, 26, 2.0) == 1
    assert layers_per_step(ExpertPlacement("stream", (1,) * 26), 2048, 26, 2.0) == 1
    # a decode step timed at 17 ms: 34 ms of share holds 4 layers of 7 ms
    assert layers_per_step(ExpertPlacement("auto", (1,) * 26, COSTS), 2048, 26, 2.0, 17.0) == 4


def test_decode_gap_sets_the_prompt_share() -> None:
    import pytest

    from hybrid.errors import HybridError

    assert EngineConfig().prompt_share == 2.0
    assert EngineConfig(decode_gap=1.5).prompt_share == 0.5
    with pytest.raises(HybridError, match="decode_gap must be above 1"):
        EngineConfig(decode_gap=1.0)


def test_a_deferred_chunk_holds_its_request_back_until_complete() -> None:
    s, short, long, batch = step_with_decode_and_prompt()
    deferred = next(c for c in batch.chunks if c.request is long)
    s.complete([c for c in batch.chunks if c is not deferred])
    s.defer(deferred)
    short.append(99)
    nxt = s.schedule()
    assert [c.request for c in nxt.chunks] == [short]  # the decode only
    assert long.num_computed_tokens == 0 and long.in_flight
    s.complete([*nxt.chunks, deferred])  # its pass ended in this step
    short.append(99)
    assert long.num_computed_tokens == 64 and not long.in_flight
    assert {c.request.request_id for c in s.schedule().chunks} == {"r1", "r100"}


def test_a_job_runs_the_part_before_the_first_moe_layer_alone_then_layers() -> None:
    from hybrid.engine.prefill.layered_prefill import LayeredPrefill
    from hybrid.engine.step.decoder import DecoderProgram  # torch: imported by this test alone

    class _FiveLayers:  # DecoderProgram's piece arithmetic: five MoE layers and the head
        num_pieces = 1 + 4 * 5
        after_layer = DecoderProgram.after_layer
        layers_passed = staticmethod(DecoderProgram.layers_passed)

    job, program = LayeredPrefill(chunk=None, state=None, layers_per_step=2), _FiveLayers()
    stops = []
    while job.pieces < program.num_pieces:
        stops.append((job.next_stop(program, decodes=True), program.layers_passed(job.pieces)))
        job.pieces = stops[-1][0]
    assert stops == [(1, 0), (9, 0), (17, 2), (21, 4)]
    assert program.layers_passed(job.pieces) == 5
    assert program.after_layer(4) == program.num_pieces  # the last layer's stop is the head's
    # no decode waits: everything left at once
    assert LayeredPrefill(None, None, 1, pieces=9).next_stop(program, decodes=False) == 21


def test_beside_a_chunk_in_flight_other_prompts_take_the_in_flight_budget() -> None:
    """While a layered chunk is in flight, a decoding step's other prompt tokens run on the CPU
    experts inside it: at most in_flight_chunk_size of them (0: they wait for the chunk)."""
    for limit, expect in ((0, 0), (5, 5)):
        s, short, long, batch = step_with_decode_and_prompt()
        deferred = next(c for c in batch.chunks if c.request is long)
        s.complete([c for c in batch.chunks if c is not deferred])
        s.defer(deferred)
        s.in_flight_chunk_size = limit
        other, _ = make(list(range(300, 340)), 5)
        s.add(other)
        short.append(99)
        nxt = s.schedule()
        prompt = [c for c in nxt.chunks if c.request is other]
        assert sum(len(c.token_ids) for c in prompt) == expect
        assert nxt.chunks[0].request is short  # the decode always runs
        s.complete([*nxt.chunks, deferred])  # the chunk passed: the whole budget again
        short.append(99)
        after = s.schedule().chunks  # long's last 36 tokens first (FCFS), then other's
        assert [len(c.token_ids) for c in after if c.request is not short] == [36, 28]


def test_in_flight_budget_keeps_the_step_within_two_decode_steps_of_cpu_experts() -> None:
    from hybrid.engine.prefill.prefill_chunk import choose_in_flight_chunk_size

    placement = ExpertPlacement("auto", (1,) * 26, COSTS)
    n = choose_in_flight_chunk_size(placement, 4096, 26, 2.0)
    one = 26 * COSTS.costs(1, 1)[1]
    assert 1 <= n < 16
    assert 26 * COSTS.costs(n, 1)[1] <= 2 * one < 26 * COSTS.costs(n + 1, 1)[1]
    # nothing streams: no chunk is ever in flight; streaming unmeasured: prompts wait
    assert choose_in_flight_chunk_size(ExpertPlacement("cpu", (1,) * 26), 512, 26, 2.0) == 512
    assert choose_in_flight_chunk_size(ExpertPlacement("stream", (1,) * 26), 2048, 26, 2.0) == 0
