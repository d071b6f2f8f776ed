"""Overlapped decode (engine.py): a step launched before the step before's tokens are read back
gives every request exactly the tokens, log-probabilities, text and finish reasons of steps
read back one by one, whatever ends a request (EOS or a stop token, a stop string, max_tokens,
a cancel) and whatever it samples with (seeds, penalties, forced tokens, top log-probabilities,
a grammar).
The CPU engine runs it eagerly with `overlap_decode="on"`; on a GPU machine the bundled rules
run it as served, on CUDA graphs (`"auto"`), greedy rows picked inside the graph."""

from __future__ import annotations

import pytest
import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.outputs import LaunchedOutputs, PendingRead
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.engine.scheduling.request import RequestStatus
from hybrid.engine.scheduling.scheduler import PENDING

CONFIG = {"max_batch_size": 8, "chunk_size": 64, "cache_lens": 2048, "page_size": 16}


def _engine_pair(path: str) -> dict[str, LLM]:
    """The file's engine with steps read back one by one ("off") and launched ahead ("on")."""
    cuda = torch.cuda.is_available()  # whole-step graphs: greedy steps launched ahead
    rules, overlap = ("DeepSeek-V3", "auto") if cuda else ("cpu.yaml", "on")
    return {name: LLM(path, rules, engine_config=EngineConfig(
        **CONFIG, overlap_decode=mode, **({"decode_graph": "step"} if cuda else {})))
        for name, mode in (("off", "off"), ("on", overlap))}


@pytest.fixture(scope="module")
def engines(models) -> dict[str, LLM]:
    return _engine_pair(str(models.path("tiny-v3", "q4_k_m")))


@pytest.fixture(scope="module")
def grammar_engines(models) -> dict[str, LLM]:
    """`engines` on the DeepSeek vocabulary (a grammar needs the real tokenizer's tokens)."""
    return _engine_pair(str(models.path("tiny-v3", "q4_k_m", vocab="deepseek")))


def _prompt(i: int, n: int) -> list[int]:
    return [(11 * i + 7 * j) % 600 + 5 for j in range(n)]


def _run(llm: LLM, cases: list[tuple[list[int], SamplingParams]], cancel_after=None):
    """Submit every case at once, step to the end -> each request's events, the requests.
    cancel_after: {case: n}: cancel that request once it has n tokens."""
    events: list[list] = [[] for _ in cases]
    requests = [llm._submit(ids, p, events[i].append) for i, (ids, p) in enumerate(cases)]
    while llm.worker.has_work:
        llm.worker.step()
        for i, n in (cancel_after or {}).items():
            if len(events[i]) >= n:
                llm.worker.cancel(requests[i])
    return events, requests


# A batch of other rows sums in another order. On CUDA a newcomer's prompt joins the batch a
# step later when the step before was launched ahead, so a decode row's step that shares it
# takes the prompt's kernels (tf32 attention products: ~3e-3 in a log-probability) on another
# token than with steps read back one by one.
LOGPROB_TOL = 1e-2 if torch.cuda.is_available() else 1e-3


def _rows(events) -> list[tuple]:
    """What a client sees of each token, its log-probability to LOGPROB_TOL."""
    return [(e.token_id, pytest.approx(e.logprob, abs=LOGPROB_TOL), e.text, e.finish_reason,
             tuple(t for t, _ in e.top_logprobs)) for e in events]


def _same_launched_ahead(off: LLM, on: LLM, cases) -> tuple[list, list]:
    """Run `cases` on both engines: every client sees the same on `on` (its steps launched
    ahead) as on `off`, nothing is left pending or holding pages -> (off's events, the batches
    `on` launched ahead)."""
    want, _ = _run(off, cases)
    batches = []

    def launch(batch, launch=on.engine.runner.launch):
        graph = launch(batch)
        if graph is not None:
            batches.append(batch)
        return graph

    on.engine.runner.launch = launch
    try:
        got, requests = _run(on, cases)
    finally:
        del on.engine.runner.launch
    for w, g in zip(want, got, strict=True):
        assert _rows(g) == _rows(w)
    assert all(r.num_pending == 0 for r in requests)
    assert on.worker.stats().kv_pages_used == 0
    return want, batches


def _greedy_tokens(llm: LLM, ids: list[int], n: int) -> list[int]:
    p = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return llm.generate(prompt_token_ids=[ids], sampling_params=p)[0].outputs[0].token_ids


def test_every_way_a_request_ends_and_samples_matches_steps_read_back_one_by_one(engines):
    off, on = engines["off"], engines["on"]
    stop_at = _greedy_tokens(off, _prompt(2, 9), 12)  # tokens it will make: stop on them
    text = off.generate(prompt_token_ids=[_prompt(3, 6)], sampling_params=SamplingParams(
        temperature=0, max_tokens=14, ignore_eos=True))[0].outputs[0].text
    cases = [
        (_prompt(0, 5), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)),
        (_prompt(1, 17), SamplingParams(temperature=0, max_tokens=13, ignore_eos=True,
                                        logprobs=3)),
        (_prompt(2, 9), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                       stop_token_ids=(stop_at[6],))),
        (_prompt(3, 6), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                       stop=(text[len(text) // 2:len(text) // 2 + 3],))),
        (_prompt(4, 12), SamplingParams(temperature=0.9, top_p=0.8, seed=11, max_tokens=17,
                                        ignore_eos=True)),
        (_prompt(5, 4), SamplingParams(temperature=0.7, seed=5, max_tokens=9, ignore_eos=True,
                                       frequency_penalty=0.8, presence_penalty=0.3,
                                       repetition_penalty=1.2)),
        (_prompt(6, 8), SamplingParams(temperature=0, max_tokens=6, forced_ids=(3, 4, 5))),
        (_prompt(7, 3), SamplingParams(temperature=0, max_tokens=20)),  # EOS may end it
    ]
    want, _ = _run(off, cases)
    got, requests = _run(on, cases)
    for w, g in zip(want, got, strict=True):
        assert _rows(g) == _rows(w)
    assert _rows(want[2])[-1][0] == stop_at[6] and want[2][-1].finish_reason == "stop"
    assert want[3][-1].finish_reason == "stop" and len(want[3]) < 30
    assert all(r.num_pending == 0 for r in requests)
    stats = on.worker.stats()
    assert stats.kv_pages_used == 0 and stats.num_running == 0


def test_launched_ahead_only_the_picks_are_taken_before_the_cpu_experts(engines):
    """Where the step launches the next ahead, the engine's thread takes the pending step's
    picks before it drives the CPU experts (the next graph rewrites their buffers after its
    last MoE layer) and Ahead makes their outputs; other steps read them back whole there."""
    on = engines["on"]
    calls: list[tuple[str | None, bool]] = []

    def run(batch, before_experts=None, ahead=None, launched=None, run=on.engine.runner.run):
        calls.append((getattr(before_experts, "__name__", None), ahead is not None))
        return run(batch, before_experts, ahead, launched)

    on.engine.runner.run = run
    try:
        cases = [(_prompt(i, 6), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
                 for i in range(3)]
        _, requests = _run(on, cases)
    finally:
        del on.engine.runner.run
    assert ("take", True) in calls
    assert all(name == ("take" if ahead else "finish") for name, ahead in calls)
    assert all(r.num_pending == 0 and r.num_output_tokens == 8 for r in requests)


def test_a_pending_read_takes_its_picks_once_and_finishes_once(engines):
    """outputs.PendingRead: `take` reads the picks off the device once; `finish` (after or
    without `take`) makes the outputs once; with nothing pending both do nothing."""

    class Picks:
        reads = 0

        def result(self):
            Picks.reads += 1
            return []

    outputs = engines["on"].engine.outputs
    read = PendingRead(outputs, LaunchedOutputs([], [], Picks()))
    read.take()
    read.take()
    read.finish()
    read.finish()
    assert Picks.reads == 1 and read.pending is None and read.into == []
    read = PendingRead(outputs, LaunchedOutputs([], [], Picks()))
    read.finish()
    assert Picks.reads == 2
    read = PendingRead(outputs, None)
    read.finish()
    assert read.into == []


def test_a_request_arriving_mid_decode_and_one_cancelled_mid_decode(engines):
    """A new prompt waits at most one step for the pending tokens to be read back; a cancelled
    request stops (its pending token is dropped) and the others go on unchanged."""
    def cases():
        return [(_prompt(10, 7), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)),
                (_prompt(11, 5), SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))]

    results = {}
    for mode, llm in engines.items():
        events: list[list] = [[], [], []]
        requests = [llm._submit(ids, p, events[i].append) for i, (ids, p) in enumerate(cases())]
        steps = 0
        while llm.worker.has_work:
            llm.worker.step()
            steps += 1
            if steps == 6:  # both decoding by now: the newcomer has a prompt to prefill
                requests.append(llm._submit(_prompt(12, 40), SamplingParams(
                    temperature=0, max_tokens=8, ignore_eos=True), events[2].append))
            if len(events[1]) >= 10 and not requests[1].is_cancel_requested:
                llm.worker.cancel(requests[1])
        results[mode] = events, requests
    (want, _), (got, requests) = results["off"], results["on"]
    assert _rows(got[0]) == _rows(want[0]) and len(got[0]) == 24
    assert _rows(got[2]) == _rows(want[2]) and len(got[2]) == 8
    # cancelled after 10 tokens: at most the token then pending reaches it, all of them right
    whole = _greedy_tokens(engines["off"], cases()[1][0], 24)
    assert 10 <= len(got[1]) <= 11 and [e.token_id for e in got[1]] == whole[:len(got[1])]
    assert requests[1].status is RequestStatus.FINISHED_CANCELLED
    assert engines["on"].worker.stats().kv_pages_used == 0


def test_decodes_run_with_their_input_still_pending(engines):
    """The overlap happens: steps are scheduled with PENDING inputs, and only decode (on a
    whole-step graph, scheduled and launched beside the step before's CPU experts)."""
    llm = engines["on"]
    seen = []
    schedule = llm.engine.scheduler.schedule

    def spy():
        batch = schedule()
        seen.append([c.token_ids for c in batch.chunks])
        return batch
    llm.engine.scheduler.schedule = spy
    launched = []
    launch = llm.engine.runner.launch
    llm.engine.runner.launch = lambda batch: launched.append(launch(batch)) or launched[-1]
    try:
        events, _ = _run(llm, [(_prompt(20, 6), SamplingParams(temperature=0, max_tokens=10,
                                                                ignore_eos=True))])
    finally:
        del llm.engine.scheduler.schedule, llm.engine.runner.launch
    assert len(events[0]) == 10
    pending = [s for s in seen if s and s[0] == [PENDING]]
    # the prompt, the first decode (its input read back: a first token), then pending ones;
    # the tenth token's step is scheduled while the ninth is pending
    assert len(pending) == 8 and all(len(s) == 1 for s in pending)
    assert seen[-1] == []  # the last step only reads the pending tokens back
    # with whole-step graphs each of those is launched during the step before, its CPU experts
    # driven by the next step's call
    if llm.engine.runner.launches_ahead:
        assert len(launched) == 8 and all(g is not None for g in launched)
    else:
        assert not launched


def test_greedy_streams_ending_at_different_steps(engines):
    """Greedy streams run launched ahead of each other's reads: requests ending on a stop token
    or max_tokens at different steps (their rows in the step already launched dropped, their
    pages freed) leave the others' tokens exactly as steps read back one by one give them."""
    off, on = engines["off"], engines["on"]
    cases = []
    for i in range(6):
        ids = _prompt(30 + i, 3 + 2 * i)
        made = _greedy_tokens(off, ids, 16)
        cases.append((ids, SamplingParams(temperature=0, max_tokens=6 + 3 * i, ignore_eos=True,
                                          logprobs=0 if i % 2 else None,
                                          stop_token_ids=(made[2 + i],) if i in (1, 4) else ())))
    want, launched = _same_launched_ahead(off, on, cases)
    assert {len(w) for w in want} != {len(want[0])}  # they did end at different steps
    assert len(launched) > 10


def test_cancelled_while_its_last_token_is_pending(engines):
    """A request cancelled while its last token is still pending is dropped by the schedule
    made ahead before that token is delivered: the token still reaches it, nothing is retired
    twice, the other stream goes on."""
    llm = engines["on"]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    events: list[list] = [[], []]
    long = llm._submit(_prompt(40, 5), greedy, events[0].append)
    short = llm._submit(_prompt(41, 7), SamplingParams(temperature=0, max_tokens=5,
                                                        ignore_eos=True), events[1].append)
    cancelled_at = None
    while llm.worker.has_work:
        llm.worker.step()
        if cancelled_at is None and short.num_pending and short.num_output_tokens == 4:
            llm.worker.cancel(short)
            cancelled_at = len(events[1])
    assert cancelled_at == 4 or not llm.engine.runner.launches_ahead
    assert [e.token_id for e in events[0]] == _greedy_tokens(llm, _prompt(40, 5), 20)
    assert [e.token_id for e in events[1]] == _greedy_tokens(llm, _prompt(41, 7), 5)[:len(
        events[1])] and len(events[1]) >= 4
    assert short.is_finished and long.status is RequestStatus.FINISHED_LENGTH
    stats = llm.worker.stats()
    assert stats.kv_pages_used == 0 and stats.num_running == 0
    assert stats.num_finished + stats.num_cancelled == stats.num_submitted - stats.num_failed


def test_dropped_rows_and_carried_picks_are_queued_without_waiting_for_the_device():
    """A request that stopped at the pending step has its row dropped from the logits, and an
    eager step's greedy picks go into the carried ids, while a step launched ahead may sit on
    the stream, its CPU experts not yet driven: neither may wait for the device (on CUDA the
    stream is still busy when they return), or the engine waits for a step only it can end."""
    from hybrid.engine.launch_ahead import live_rows
    from hybrid.engine.sampling.sampler import launch_samples

    logits = torch.arange(12.0).view(4, 3)
    requests = ["a", "b", "c", "d"]
    kept, names, picks = live_rows(logits, requests, None, [0, 2, 3])
    assert torch.equal(kept, logits[[0, 2, 3]]) and names == ["a", "c", "d"] and picks is None
    assert live_rows(logits, requests, None, [0, 1, 2, 3])[0] is logits
    if not torch.cuda.is_available():
        return
    device = torch.device("cuda")
    logits = torch.randn(4, 64, device=device)
    carry = torch.zeros(8, dtype=torch.int64, device=device)
    greedy = SamplingParams(temperature=0, max_tokens=4)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # a queued step that does not end on its own soon
    kept, _, _ = live_rows(logits, requests, None, [2, 0])
    launched = launch_samples(kept, [(greedy, None, [], [])] * 2, carry=carry, carry_rows=[5, 1])
    assert not torch.cuda.current_stream().query()  # returned while the stream was busy
    torch.cuda.synchronize()
    want = logits[[2, 0]].argmax(-1).tolist()
    assert [s.token_id for s in launched.result()] == want and carry[[5, 1]].tolist() == want


def test_sampled_streams_are_launched_ahead_with_the_tokens_of_steps_read_back(engines):
    """Seeded sampled streams (top_p, top_k, min_p, penalties, top log-probabilities) and a
    greedy one run launched ahead: each step's draw is queued on the device into the carried
    ids before the next step launches, and every stream gets exactly the tokens of steps read
    back one by one (one uniform a step from its generator either way)."""
    off, on = engines["off"], engines["on"]
    cases = [(_prompt(50, 7), SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=14,
                                             ignore_eos=True)),
             (_prompt(51, 4), SamplingParams(temperature=1.1, top_k=20, min_p=0.02, seed=4,
                                             max_tokens=11, ignore_eos=True, logprobs=2)),
             (_prompt(52, 9), SamplingParams(temperature=0.6, seed=5, max_tokens=16,
                                             ignore_eos=True, presence_penalty=0.5,
                                             repetition_penalty=1.1)),
             (_prompt(53, 5), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    assert len(_same_launched_ahead(off, on, cases)[1]) >= 8


def test_grammar_streams_are_launched_ahead_with_the_tokens_of_steps_read_back(grammar_engines):
    """Requests under a grammar (a seeded sampled schema, a greedy JSON object) beside a free
    sampled one run launched ahead: each step's mask is built from the matcher that took the
    step before's token while the step ran up to its first MoE layer, queued with the draw, and
    every stream gets the tokens of steps read back one by one; the finished ones parse."""
    import json

    from hybrid.engine.sampling.grammar import json_grammar

    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": ["a", "bb", "ccc"]}}, "required": ["n", "tag"],
        "additionalProperties": False}
    off, on = grammar_engines["off"], grammar_engines["on"]
    cases = [(_prompt(60, 6), SamplingParams(temperature=0.9, seed=7, max_tokens=40,
                                             grammar=json_grammar(schema), logprobs=1)),
             (_prompt(61, 3), SamplingParams(temperature=0, max_tokens=24,
                                             grammar=json_grammar(None))),
             (_prompt(62, 8), SamplingParams(temperature=0.7, top_p=0.9, seed=2, max_tokens=14,
                                             ignore_eos=True))]
    want, batches = _same_launched_ahead(off, on, cases)
    assert sum(any(c.request.params.grammar for c in b.chunks) for b in batches) >= 8
    text = "".join(e.text for e in want[0])
    assert want[0][-1].finish_reason == "stop" and set(json.loads(text)) == {"n", "tag"}


def test_a_grammar_mask_is_queued_without_waiting_for_the_device(grammar_engines):
    """Masking a step's rows by their grammars (some rows free) returns while the stream is
    still busy, and masks as on an idle device."""
    from hybrid.engine.sampling.grammar import json_grammar, mask_logits

    if not torch.cuda.is_available():
        pytest.skip("a busy stream needs CUDA")
    outputs = grammar_engines["on"].engine.outputs
    vocab = outputs.grammar_vocab
    matchers = [vocab.matcher(json_grammar(None)), None, vocab.matcher(json_grammar(None))]
    logits = torch.randn(3, outputs.vocab_size, device="cuda")
    want = logits.clone()
    mask_logits(want, matchers)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # the pinned blocks taken behind a busy stream, as serving
    mask_logits(logits.clone(), matchers)
    got = logits.clone()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # a queued step that does not end on its own soon
    mask_logits(got, matchers)
    assert not torch.cuda.current_stream().query()  # returned while the stream was busy
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(got[1], logits[1])
    assert bool(torch.isinf(got[0]).any()) and bool(torch.isinf(got[2]).any())


def test_a_sampled_draw_is_queued_without_waiting_for_the_device():
    """The draw of top_p / top_k / min_p rows, with penalties and top log-probabilities, into
    the carried ids returns while the stream is still busy (a step launched ahead may sit on
    it), and draws what it draws on an idle device."""
    from hybrid.engine.sampling.penalties import PenaltyState
    from hybrid.engine.sampling.sampler import launch_samples, make_generator

    if not torch.cuda.is_available():
        pytest.skip("a busy stream needs CUDA")
    device = torch.device("cuda")
    logits = torch.randn(3, 5000, device=device) * torch.tensor([[6.0], [0.01], [1.0]],
                                                                device=device)
    params = [SamplingParams(temperature=0.7, top_p=0.9, seed=1),
              SamplingParams(temperature=1.0, top_p=0.5, seed=2, logprobs=3),  # flat: sorted whole
              SamplingParams(temperature=0.9, top_k=40, min_p=0.05, seed=3,
                             frequency_penalty=0.4)]

    def launch(carry):
        rows = [(p, make_generator(p), [1, 2], [3]) for p in params]
        states = [PenaltyState([1, 2], 5000, device) if p.has_penalties else None
                  for p in params]
        return launch_samples(logits, rows, states, carry=carry, carry_rows=[4, 0, 2])

    # a first draw behind a busy stream too: the pinned blocks its copies take stay in use
    # until the stream reaches them, so this fills the host allocator's cache as the steps
    # before fill it while serving (a new pinned block may wait for the device)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    want = [s.token_id for s in launch(torch.zeros(8, dtype=torch.int64, device=device))
            .result()]
    carry = torch.zeros(8, dtype=torch.int64, device=device)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # a queued step that does not end on its own soon
    launched = launch(carry)
    assert not torch.cuda.current_stream().query()  # returned while the stream was busy
    torch.cuda.synchronize()
    assert [s.token_id for s in launched.result()] == want and carry[[4, 0, 2]].tolist() == want
