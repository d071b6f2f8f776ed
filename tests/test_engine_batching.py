"""The real engine on a tiny model: batched forwards over the paged latent cache give each
request exactly what it gets alone; chunked prefill equals unchunked; a small cache queues."""

from __future__ import annotations

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.errors import RequestRejected


@pytest.fixture(scope="module")
def tiny(models) -> str:
    return str(models.path("tiny-v3", "q4_k_m"))


@pytest.fixture(scope="module")
def llm(tiny) -> LLM:
    return LLM(tiny, "cpu.yaml", engine_config=EngineConfig(max_batch_size=16, chunk_size=64,
                                                            cache_lens=2048, page_size=16))


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)


def test_sixteen_requests_in_one_batch_equal_each_run_alone(llm: LLM) -> None:
    cases = [([(7 * i + j) % 500 + 3 for j in range(1 + 3 * i)], 8 + i % 5) for i in range(16)]
    alone = []
    for ids, n in cases:
        alone.append(llm.generate(prompt_token_ids=[ids], sampling_params=greedy(n))[0].outputs[0])
    steps_before = llm.worker.stats().num_steps
    requests = []
    events: list[list] = [[] for _ in cases]
    for i, (ids, n) in enumerate(cases):
        requests.append(llm._submit(ids, greedy(n), events[i].append))
    while llm.worker.has_work:
        llm.worker.step()
    for (ids, n), ref, got in zip(cases, alone, events):
        assert [e.token_id for e in got] == ref.token_ids and len(got) == n
        assert [e.logprob for e in got] == pytest.approx(ref.logprobs, abs=1e-3)
    stats = llm.worker.stats()
    assert stats.max_batch_requests == 16 and stats.kv_pages_used == 0
    # Decodes of different requests ran in the same forward: the step log shows them.
    assert max(decodes for _, decodes, _ in llm.worker.step_log) > 1
    # 16 prompts of 1..46 tokens (376 in all) at 64 prompt tokens per step, then decodes:
    assert stats.num_steps - steps_before < sum(n for _, n in cases)


def test_chunked_prefill_equals_unchunked(tiny, llm: LLM) -> None:
    prompt = [(13 * j) % 700 + 2 for j in range(150)]  # > chunk_size 64 and > 7
    chunked = LLM(tiny, "cpu.yaml", engine_config=EngineConfig(chunk_size=7, cache_lens=512,
                                                               page_size=16))
    whole = llm.generate(prompt_token_ids=[prompt], sampling_params=greedy(10))[0].outputs[0]
    before = chunked.worker.stats().num_steps
    parts = chunked.generate(prompt_token_ids=[prompt], sampling_params=greedy(10))[0].outputs[0]
    assert chunked.worker.stats().num_steps - before == -(-150 // 7) + 9  # 22 chunks, 9 decodes
    assert parts.token_ids == whole.token_ids
    assert parts.logprobs == pytest.approx(whole.logprobs, abs=1e-4)


def test_small_cache_queues_every_request_and_rejects_what_never_fits(tiny) -> None:
    small = LLM(tiny, "cpu.yaml", engine_config=EngineConfig(cache_lens=64, page_size=16))
    prompts = [[i + 2, i + 3, i + 4] for i in range(32)]
    outs = small.generate(prompt_token_ids=prompts, sampling_params=greedy(13))
    assert all(len(o.outputs[0].token_ids) == 13 for o in outs)
    stats = small.worker.stats()
    assert stats.num_finished == 32 and stats.max_running == 4 and stats.kv_pages_used == 0
    with pytest.raises(RequestRejected, match="at most 64 tokens.*--cache-lens"):
        small.generate(prompt_token_ids=[list(range(2, 66))], sampling_params=greedy(1))
    # Asking for more than fits is clamped: the request ends with "length" at the cache's end.
    out = small.generate(prompt_token_ids=[list(range(2, 62))], sampling_params=greedy(50))
    assert len(out[0].outputs[0].token_ids) == 4 and out[0].outputs[0].finish_reason == "length"


def test_stream_closed_early_frees_its_pages(llm: LLM) -> None:
    stream = llm.stream([5, 6, 7], greedy(40))
    assert [next(stream).token_id for _ in range(3)]
    assert llm.worker.stats().kv_pages_used == 3  # 43 tokens in pages of 16
    stream.close()
    assert llm.worker.stats().kv_pages_used == 0 and not llm.worker.has_work


@pytest.mark.parametrize("where", ["detokenizer", "sampling"])
def test_one_requests_failure_fails_it_alone(llm: LLM, where: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose own token handling raises (here its detokenizer, or its sampling
    settings) fails with the cause; the requests batched beside it get what they get alone."""
    from hybrid.engine import outputs as engine_module
    from hybrid.engine.scheduling.request import RequestFailed

    cases = [[3, 5, 7 + i] for i in range(4)]
    alone = [llm.generate(prompt_token_ids=[ids], sampling_params=greedy(6))[0].outputs[0]
             for ids in cases]
    bad = SamplingParams(temperature=0.5, max_tokens=6, ignore_eos=True, seed=1)
    if where == "sampling":  # a draw that raises for this request's settings only
        real = engine_module.launch_samples

        def fussy(logits, rows, penalties=None, carry=None, carry_rows=None):
            if any(p is bad for p, *_ in rows):
                raise RuntimeError("this request's draw failed")
            return real(logits, rows, penalties, carry, carry_rows)
        monkeypatch.setattr(engine_module, "launch_samples", fussy)
    events: list[list] = [[] for _ in range(5)]
    requests = [llm._submit(ids, greedy(6), events[i].append) for i, ids in enumerate(cases)]
    requests.append(llm._submit([3, 5, 99], bad, events[4].append))
    if where == "detokenizer":
        llm.worker.step()  # the prompts' step made each request's output state
        state = llm.engine.outputs.state(requests[4])

        def broken(token_id: int) -> str:
            raise ValueError("this request's text failed")
        monkeypatch.setattr(state.detokenizer, "push", broken)
    while llm.worker.has_work:
        llm.worker.step()
    failed = [e for e in events[4] if isinstance(e, RequestFailed)]
    assert len(failed) == 1 and "failed" in failed[0].message
    for ref, got in zip(alone, events[:4], strict=True):
        assert [e.token_id for e in got] == ref.token_ids
    stats = llm.worker.stats()
    assert stats.kv_pages_used == 0 and stats.num_failed >= 1
