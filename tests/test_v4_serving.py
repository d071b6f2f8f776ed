"""DeepSeek-V4 served (hybrid/engine/runner/transformers_runner.py): the bundled DeepSeek-V4.yaml
by default, five prompts at once in chunks, their greedy tokens and log-probabilities against
transformers' own model recomputing every token from scratch; a request whose cache is lost
rebuilds it from its tokens; and a chat completion through the HTTP server."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.synth.presets_v4 import TINY_V4

_rng = np.random.default_rng(4)
# past the 16-token window, the 4-token CSA windows and (the last two) the 128-token HCA one
PROMPTS = [[int(t) for t in _rng.integers(3, 1000, size=n)] for n in (3, 17, 70, 150, 260)]
NEW = 24


@pytest.fixture(scope="module")
def v4(models):
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v4", "f32"))
    return path, LLM(path, None, engine_config=EngineConfig(chunk_size=64, max_batch_size=4))


def _reference(path: str, prompt: list[int]) -> tuple[list[int], list[float]]:
    """transformers' DeepseekV4 on the same weights: greedy, every token from the whole
    sequence again (no cache) -> (tokens, their log-probabilities)."""
    from hybrid.model.loader import load_model

    model = _reference.models.setdefault(path, load_model(path).model)
    ids, logprobs = list(prompt), []
    with torch.inference_mode():
        for _ in range(NEW):
            row = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(),
                                    -1)
            ids.append(int(row.argmax()))
            logprobs.append(float(row[ids[-1]]))
    return ids[len(prompt):], logprobs


_reference.models = {}


def test_five_prompts_at_once_equal_transformers(v4) -> None:
    path, llm = v4
    assert llm.loaded.spec.arch == "deepseek4"
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)  # 4 run, 1 queues
    worst = 0.0
    for prompt, out in zip(PROMPTS, outs):
        tokens, logprobs = _reference(path, prompt)
        assert out.outputs[0].token_ids == tokens
        worst = max(worst, max(abs(a - b) for a, b in zip(out.outputs[0].logprobs, logprobs)))
    assert worst <= 1e-3  # measured 3.0e-6


def test_a_lost_cache_is_rebuilt_from_the_requests_tokens(v4) -> None:
    """A step that failed may leave a cache part-way through a chunk; the runner then finds a
    cache of the wrong length, or none, and replays the request's own tokens."""
    path, llm = v4
    runner = llm.engine.runner
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    got = []
    for i, event in enumerate(llm.stream(PROMPTS[3], params)):
        got.append(event.token_id)
        if i == 5:
            runner._caches.clear()  # as after a failure: every cache gone
        if i == 11:
            held = next(iter(runner._caches.values()))
            held.length -= 1  # a cache that does not hold what its request has
    assert got == _reference(path, PROMPTS[3])[0]
    assert runner._caches == {}  # the finished request's cache went with it


def test_cancelling_frees_its_cache(v4) -> None:
    _, llm = v4
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    stream = llm.stream(PROMPTS[1], params)
    next(stream)
    assert len(llm.engine.runner._caches) == 1
    stream.close()  # the reader stops: the request is cancelled
    assert llm.engine.runner._caches == {}


def test_chat_through_the_server(models) -> None:
    import httpx

    from server.config import ServerConfig
    from server.inprocess import InProcessServer
    from server.serve import build_state

    config = ServerConfig.from_flat({"gguf_path": str(models.path("tiny-v4", "f32"))})
    state = build_state(config, start=False)
    state.worker.start()
    server = InProcessServer(state)
    try:
        body = {"model": state.model.name, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Hello there"}]}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length")
        assert r.json()["usage"]["completion_tokens"] >= 1
        # V4's own format (the file carries no template: ours of V4's encoding), a required call
        # in its DSML block read back as OpenAI's
        from tests.test_tool_calls import SCHEMAS, TOOLS

        assert "tool_calls>" in state.model.tokenizer.chat_template.source
        body = {**body, "max_tokens": 400, "tools": TOOLS, "parallel_tool_calls": False,
                "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_time"
        assert json.loads(call["function"]["arguments"])["zone"] in \
            SCHEMAS["get_time"]["properties"]["zone"]["enum"]
    finally:
        server.stop()


def test_routing_recorded_tuned_and_the_hot_experts_keep_the_tokens(models, tmp_path) -> None:
    """`hybrid profile` / `--record-routing` through transformers' forward: every token's
    choices counted once per layer, prompt and decode apart; `hybrid tune` writes hot experts
    from it (the GPU mapped onto the CPU); the tuned rules, in exact mode, serve transformers'
    greedy tokens."""
    from cli.main import main
    from hybrid.engine.llm import LLM
    from hybrid.rules.planner import plan_model, with_experts_mode
    from hybrid.tuning.profile import RoutingProfile

    path = str(models.path("tiny-v4", "q4_k_m"))
    profile = tmp_path / "profile.json"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the history of Rome"}\n{"prompt": "a poem about the sea"}\n')
    assert main(["profile", "--gguf-path", path, "--prompts", str(prompts), "--max-tokens", "5",
                 "--out", str(profile)]) == 0
    recorded = RoutingProfile.load(profile)
    k = TINY_V4.num_experts_per_tok
    assert recorded.decode_tokens == 2 * (5 - 1) and recorded.prefill_tokens > 0
    assert recorded.layers == (0, 1, 2)
    assert (recorded.decode.sum(1) == k * recorded.decode_tokens).all()
    assert (recorded.prefill.sum(1) == k * recorded.prefill_tokens).all()
    out = tmp_path / "tuned.yaml"
    assert main(["tune", "--gguf-path", path, "--profile", str(profile), "--gpu-memory",
                 "2GiB", "--cache-lens", "4096", "--device-map", "cuda=cpu", "--no-plots",
                 "--out", str(out)]) == 0
    tuned = plan_model(path, str(out), check_devices=False, announce=False).plan
    held = [p.options["gpu_experts"] for n, p in tuned.placements.items()
            if n.endswith("mlp.experts")]
    assert len(held) == 3 and all(held)
    exact = with_experts_mode(str(out), "exact", tmp_path)
    llm = LLM(path, str(exact), device_map={"cuda": "cpu"},
              engine_config=EngineConfig(chunk_size=64, max_batch_size=2))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
    for prompt in PROMPTS[:2]:
        got = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0]
        want, logprobs = _reference(path, prompt)
        assert got.token_ids == want[:8]
        assert max(abs(a - b) for a, b in zip(got.logprobs, logprobs)) <= 1e-4


def test_a_rebuilt_cache_is_not_counted_again(models) -> None:
    """With routing recorded, the tokens a lost cache replays were counted when they first
    ran: the counts stay one per token and phase."""
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v4", "f32"))
    llm = LLM(path, None, engine_config=EngineConfig(chunk_size=64, max_batch_size=2,
                                                     record_routing=True))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, _event in enumerate(llm.stream(PROMPTS[2], params)):
        if i == 3:
            llm.engine.runner._caches.clear()  # as after a failure
    counts, tokens, layers = llm.engine.routing_counts()
    assert tokens == [len(PROMPTS[2]), 8 - 1] and layers == [0, 1, 2]
    k = TINY_V4.num_experts_per_tok
    assert all(sum(row) == k * tokens[phase] for phase in (0, 1) for row in counts[phase])


def _streamed(llm, prompt: list[int], new: int) -> tuple[list[int], list[float], int]:
    """(greedy tokens, their log-probabilities, the cached prompt tokens reported)."""
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    events = list(llm.stream(prompt, params))
    return [e.token_id for e in events], [e.logprob for e in events], events[0].cached_tokens


def test_a_next_turn_continues_from_the_stored_cache(models) -> None:
    """The prefix cache of a model run through transformers' forward (whole caches,
    engine/runner/cache_store.py): a prompt that begins with an earlier request's whole
    sequence, or only with its prompt, computes the rest, reports the shared tokens as cached
    and gives transformers' tokens; with the prefix cache off nothing is kept."""
    from hybrid.engine.llm import LLM

    path = str(models.path("tiny-v4", "f32"))
    config = EngineConfig(chunk_size=64, max_batch_size=2)
    llm = LLM(path, None, engine_config=config)
    first = PROMPTS[3]  # 150 tokens: three chunks
    tokens, _, cached = _streamed(llm, first, 6)
    assert cached == 0
    turn = first + tokens[:-1] + [5, 6, 7]  # all it held (its last token was never fed back)
    other = first + [8, 9]  # its prompt only: the prompt's own entry
    for prompt, shared in ((turn, len(first) + 5), (other, len(first))):
        got, logprobs, cached = _streamed(llm, prompt, 8)
        assert cached == shared
        want, want_logprobs = _reference(path, prompt)
        assert got == want[:8]
        assert max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) <= 1e-4
    assert llm.worker.stats().num_cached_prompt_tokens == 2 * len(first) + 5  # /health's count
    off = LLM(path, None, engine_config=EngineConfig(chunk_size=64, max_batch_size=2,
                                                     prefix_cache=False))
    _streamed(off, first, 2)
    assert off.engine.runner.store is None and _streamed(off, other, 2)[2] == 0


def test_a_failed_forward_leaves_nothing_to_reuse(models, monkeypatch) -> None:
    """A forward that fails part-way (here in the second MoE layer) may leave the first
    layers' caches a chunk ahead: the request fails, its cache is dropped, not stored, and the
    same prompt then runs from scratch with transformers' tokens."""
    from hybrid.engine.llm import LLM
    from hybrid.errors import HybridError
    from hybrid.ops.experts import ExpertsOp

    path = str(models.path("tiny-v4", "f32"))
    llm = LLM(path, None, engine_config=EngineConfig(chunk_size=64, max_batch_size=2))
    op = llm.engine.runner.model.model.layers[1].mlp.experts
    calls = {"n": 0}
    real = ExpertsOp.forward

    def flaky(self, *args):
        if self is op:
            calls["n"] += 1
            if calls["n"] == 2:  # the second chunk of the prompt
                raise RuntimeError("injected")
        return real(self, *args)

    monkeypatch.setattr(ExpertsOp, "forward", flaky)
    prompt = PROMPTS[3]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with pytest.raises(HybridError, match="injected"):
        list(llm.stream(prompt, params))
    assert llm.engine.runner._caches == {} and len(llm.engine.runner.store) == 0
    got, _, cached = _streamed(llm, prompt, 8)
    assert cached == 0 and got == _reference(path, prompt)[0][:8]
