"""Expert-offload tuning: skewed synthetic routers, routing profiles (counts exact, prompt and
decode apart, graph padding skipped), and profile -> tune -> serve end to end on the tiny
model, the written rule file valid and within its GPU budget."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybrid.errors import HybridError
from hybrid.synth.router_skew import calibrated_bias, zipf_shares
from hybrid.tuning.profile import RoutingProfile


@pytest.mark.parametrize("experts,k,skew", [(64, 6, 0.6), (16, 4, 1.5), (256, 8, 0.0)])
def test_zipf_shares_sum_to_k_and_never_pass_one(experts, k, skew) -> None:
    s = zipf_shares(experts, k, skew)
    assert s.sum() == pytest.approx(k) and (s <= 1 + 1e-12).all()
    assert (np.diff(s) <= 1e-12).all()  # most used first
    if skew == 0:
        assert np.allclose(s, k / experts)


def test_calibrated_bias_reproduces_the_shares_under_the_router() -> None:
    from gpu_kernels.reference import route_ref

    shares = zipf_shares(64, 6, 0.6)[np.random.default_rng(0).permutation(64)]
    bias = calibrated_bias(shares, 6, 1, 1, seed=1)
    logits = torch.randn(16384, 64, generator=torch.Generator().manual_seed(2)) * 2.0
    _, ids = route_ref(logits, torch.from_numpy(bias), 6, True, 1, 1, False, 1.0)
    freq = np.bincount(ids.flatten().numpy(), minlength=64) / 16384
    assert np.abs(freq - shares).max() < 0.05
    top = np.argsort(shares)[::-1][:16]
    assert freq[top].sum() / 6 == pytest.approx(shares[top].sum() / 6, abs=0.03)


def test_router_skew_needs_a_selection_bias(tmp_path) -> None:
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    p = get_preset("tiny-v2-lite")
    with pytest.raises(HybridError, match="needs a router with a selection bias"):
        make_model(MakeModelOptions(p, router_skew=0.6), get_vocab("small", p.vocab_size),
                   tmp_path / "m.gguf")


def test_recorder_counts_phases_and_skips_padding_rows() -> None:
    from hybrid.engine.step.routing_recorder import RoutingRecorder

    rec = RoutingRecorder([1, 2], num_experts=4)
    # 3 decode rows (the second is a graph's padding: length 0), then 2 prompt rows
    fb = SimpleNamespace(num_decodes=3, seq_lens=torch.tensor([5, 0, 7]))
    ids = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [3, 1]])
    with torch.inference_mode():  # warm-up steps run in it, graph capture does not
        rec.add(1, ids, fb)
    rec.add(2, ids.flip(1), fb)
    counts, tokens = rec.snapshot()
    assert tokens == [2, 2]  # [prompt, decode]
    assert counts[1][0] == [1, 2, 1, 0]  # decode rows 0 and 2 of layer 1
    assert counts[0][0] == [1, 1, 0, 2]  # prompt rows 3 and 4
    assert counts[1][1] == counts[1][0]
    rec.reset()
    assert rec.snapshot()[1] == [0, 0]



def test_recorder_rereads_each_run_of_the_same_step() -> None:
    """A graph's warm-up and capture run one ForwardBatch: the second run must read the
    sequence lengths again (inside a capture, as ops of the graph), not reuse the first's rows;
    a padding row's out-of-range ids are not counted and do not index outside the table."""
    from hybrid.engine.step.routing_recorder import RoutingRecorder

    rec = RoutingRecorder([1], num_experts=4)
    seq_lens = torch.tensor([5, 6])
    fb = SimpleNamespace(num_decodes=2, seq_lens=seq_lens)
    ids = torch.tensor([[0, 1], [2, 3]])
    rec.add(1, ids, fb)
    seq_lens[1] = 0  # the next replay pads row 1, whose router output is garbage
    rec.add(1, torch.tensor([[0, 1], [-7, 1 << 40]]), fb)
    counts, tokens = rec.snapshot()
    assert tokens == [0, 3]
    assert counts[1][0] == [2, 2, 1, 1]

def test_profile_file_round_trip_and_refusals(tmp_path) -> None:
    p = RoutingProfile.from_counts("m.gguf", 2, [1, 2], [[[1, 2, 3], [0, 0, 6]],
                                                          [[2, 2, 2], [3, 3, 0]]], [3, 3])
    p.save(tmp_path / "p.json")
    q = RoutingProfile.load(tmp_path / "p.json")
    assert q.layers == (1, 2) and (q.decode == p.decode).all() and q.decode_tokens == 3
    assert np.allclose(q.frequencies("decode")[0], [2 / 3] * 3)
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(HybridError, match="is not a routing profile"):
        RoutingProfile.load(tmp_path / "bad.json")
    data = p.to_json()
    data["decode"] = [[1, 2]]
    with pytest.raises(HybridError, match="malformed"):
        RoutingProfile.from_json(data)


@pytest.fixture(scope="module")
def skewed(models, tmp_path_factory):
    """A tiny V3-routed model with skewed routers, and its routing profile from `hybrid
    profile` over a prompts file."""
    from cli.main import main
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    root = tmp_path_factory.mktemp("tune")
    p = get_preset("tiny-v3")
    (path,) = make_model(MakeModelOptions(p, "q4_k_m", router_skew=1.0),
                         get_vocab("small", p.vocab_size), root / "skewed.gguf")
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in [
        {"prompt": "The history of Rome"}, "A poem about the sea.",
        {"messages": [{"role": "user", "content": "Plan a trip to Oslo."}]},
        {"prompt": "def fib(n):"}]) + "\n")
    assert main(["profile", "--gguf-path", str(path), "--optimize-rules", "cpu.yaml",
                 "--prompts", str(prompts), "--max-tokens", "24", "--out",
                 str(root / "profile.json")]) == 0
    return path, root, RoutingProfile.load(root / "profile.json")


def test_profile_counts_every_token_of_both_phases(skewed) -> None:
    from hybrid.engine.llm import LLM

    path, _root, profile = skewed
    llm = LLM(str(path), "cpu.yaml")
    tok = llm.tokenizer
    lengths = [len(tok.encode(t)) for t in ("The history of Rome", "A poem about the sea.",
                                            "def fib(n):")]
    lengths.append(len(tok.encode_chat([{"role": "user", "content": "Plan a trip to Oslo."}])))
    assert profile.prefill_tokens == sum(lengths)
    # each prompt's first token comes from its prompt's step; a reply may end early (EOS)
    assert 0 < profile.decode_tokens <= 4 * (24 - 1)
    k = llm.loaded.spec.num_experts_per_tok
    assert (profile.decode.sum(1) == k * profile.decode_tokens).all()
    assert (profile.prefill.sum(1) == k * profile.prefill_tokens).all()
    assert profile.layers == tuple(range(1, 4))


def test_profile_tune_serve_end_to_end(skewed, capsys) -> None:
    """The tuned rule file is valid, within the budget, holds the most used experts, and a
    server runs it (its GPU mapped onto the CPU here)."""
    import openai

    from cli.main import main
    from hybrid.rules.explain import GPU_RESERVE_BYTES, explain
    from hybrid.rules.planner import plan_model
    from hybrid.tuning.planner import expert_bytes
    from server.config import ServerConfig
    from server.routing_writer import RoutingWriter
    from server.serve import build_state
    from tests.test_server_support import API_KEY, LiveServer

    path, root, profile = skewed
    base = plan_model(str(path), "DeepSeek-V3", check_devices=False, announce=False)
    sizes = expert_bytes(base.plan, 16)
    fixed = explain(base.plan, base.spec, 1024, 1 << 40, None).devices["cuda:0"]
    quarter = sum(sizes.per_layer.values()) * 16 // 4  # a quarter of all routed experts
    budget = fixed.weights + fixed.kv_cache + GPU_RESERVE_BYTES + quarter
    out = root / "tuned.yaml"
    assert main(["tune", "--gguf-path", str(path), "--optimize-rules", "DeepSeek-V3",
                 "--profile", str(root / "profile.json"), "--gpu-memory", str(budget),
                 "--cache-lens", "1024", "--out", str(out), "--measure", "--steps", "4",
                 "--repeats", "2", "--budgets", "0.5", "--device-map", "cuda=cpu",
                 "--sweep-threads", "1",
                 "--sweep-chunk-sizes", "32,128", "--prefill-tokens", "256",
                 "--cpu-bandwidth", "20"]) == 0
    out_err = capsys.readouterr()
    text = out_err.out
    assert ("measuring decode: hot experts 100% of free, then with its CPU experts answered at "
            "once (round 2 of 2)") in out_err.err
    assert "hot experts 100% of free" in text and "whole layers" in text
    assert f"the compared placements' rule files: {root / 'tuned-variants'}/" in text
    assert "read bandwidth (20.0 GB/s)" in text
    report = json.loads(out.with_suffix(".json").read_text())
    hot = {int(k): v for k, v in report["hot_experts"].items()}
    assert sum(map(len, hot.values())) == 4 * 3  # a quarter of 16 experts, 3 MoE layers
    freq = profile.frequencies("decode")
    for i, layer in enumerate(profile.layers):  # equal sizes: the most chosen per layer win
        chosen = freq[i, hot.get(layer, [])]
        others = np.delete(freq[i], hot.get(layer, []))
        assert chosen.size == 0 or others.size == 0 or chosen.min() >= others.max() - 1e-12
    full = next(p for p in report["placements"] if p["name"].startswith("hot experts 100%"))
    assert full["hit_rate"] > 0.25  # skewed: a quarter of the experts serve more than that
    assert all(p["measured_ms"] and p["predicted_ms"] for p in report["placements"])
    # two rounds over every placement, each placement's median kept
    assert all(len(p["samples_ms"]) == 2 and p["measured_ms"] == sum(p["samples_ms"]) / 2
               for p in report["placements"])
    # the fixed part is measured (the median of a sample a round), not the fit's intercept
    model = report["model"]
    assert model["fixed_measured"] and model["fixed_ms"] > 0
    assert all(p["predicted_ms"] == pytest.approx(
        model["fixed_ms"] + model["ms_per_gb"] * p["cpu_bytes_per_step"] / 1e9
        + model["ms_per_layer"] * p["cpu_layers"]) for p in report["placements"])
    # whole layers are written as every expert held, so the decode step stays capturable
    whole = plan_model(str(path), str(root / "tuned-variants" / "whole-layers.yaml"),
                       check_devices=False, announce=False).plan
    held = [p.options.get("gpu_experts") for n, p in whole.placements.items()
            if n.endswith("mlp.experts") and p.options.get("gpu_experts")]
    name = next(p["name"] for p in report["placements"] if p["name"].startswith("whole layers"))
    assert len(held) == int(name.split("(")[1].rstrip(")"))
    assert all(ids == list(range(16)) for ids in held)
    assert all(p.options.get("backend") == "cpu" for n, p in whole.placements.items()
               if n.endswith("mlp.experts"))
    assert [t["cpu_threads"] for t in report["threads"]] == [1]
    assert [c["chunk_size"] for c in report["chunk_sizes"]] == [32, 128]
    assert all(c["prefill_tok_s"] > 0 for c in report["chunk_sizes"])
    assert "--chunk-size 128:" in text
    for png in ("heatmap", "hit-rate", "predicted"):
        assert (root / f"tuned-{png}.png").stat().st_size > 1000
    tuned = plan_model(str(path), str(out), check_devices=False, announce=False)
    assert explain(tuned.plan, tuned.spec, 1024, budget, None).fits
    config = ServerConfig.from_flat({"gguf_path": str(path), "optimize_rules": str(out),
                                     "device_map": "cuda=cpu", "api_key": API_KEY,
                                     "routing_profile": str(root / "live.json")})
    server = LiveServer(build_state(config, warmup=False))
    writer = RoutingWriter(server.state.worker.engine, "skewed.gguf", config.routing_profile)
    writer.start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        r = client.completions.create(model=server.state.model.name, prompt=[0, 5, 9],
                                      max_tokens=8, temperature=0)
        assert r.choices[0].finish_reason == "length"
    finally:
        server.close()
        writer.stop()
    live = RoutingProfile.load(root / "live.json")  # serve --record-routing's file
    assert (live.prefill_tokens, live.decode_tokens) == (3, 7)


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_hot_experts_give_the_same_tokens_as_the_cpu_alone(models, tmp_path, mode) -> None:
    """A layer whose hot experts live elsewhere (here gpu_device cpu, torch on the blocks) is
    still bridged: the host skips the held slots and the held experts add their share, so
    greedy tokens and logprobs equal the all-CPU run's."""
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.rules.planner import find_rules, plan_model, with_experts_mode
    from hybrid.tuning.rules_writer import hot_expert_rules, write_rules

    path = str(models.path("tiny-v3", "q4_k_m"))
    base = with_experts_mode("cpu.yaml", mode, tmp_path) if mode == "fast" else \
        find_rules("cpu.yaml")
    planned = plan_model(path, str(base), check_devices=False, announce=False)
    hot = {1: [0, 3, 5, 9], 2: list(range(8)), 3: [15]}
    rules = write_rules(planned.rules_path, hot_expert_rules(planned.plan, hot, "cpu"),
                        tmp_path / "hot.yaml", "test")
    prompts = [[0, 5, 9, 11, 300], [0, 17, 2, 90], [0, 44] * 6]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=0)
    want = LLM(path, str(base)).generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(path, str(rules))
    assert all(layer.mlp.experts.gpu_experts is not None for layer in
               llm.loaded.model.model.layers[1:])
    assert llm.engine.runner.program.can_capture  # bridged: no layer forces an eager step
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        # fast mode's int8 activations against the held experts' fp32: its stated error
        tol = 1e-4 if mode == "exact" else 2e-2
        assert g.outputs[0].logprobs == pytest.approx(w.outputs[0].logprobs, abs=tol)


def test_the_decode_model_fits_a_cost_per_cpu_layer_from_a_third_point() -> None:
    from hybrid.tuning.predict import DecodeModel

    def truth(gb: float, n: int) -> float:
        return 10.0 + 40.0 * gb + 1.5 * n
    points = [(g * 1e9, n, truth(g, n)) for g, n in ((0.6, 26), (0.3, 26), (0.45, 20))]
    m = DecodeModel.fit(points)
    assert (m.fixed_ms, m.ms_per_gb, m.ms_per_layer) == pytest.approx((10.0, 40.0, 1.5))
    assert m.ms(0.2e9, 13) == pytest.approx(truth(0.2, 13))
    # two points (or one layer count): no per-layer term, as before
    two = DecodeModel.fit(points[:2])
    assert two.ms_per_layer == 0.0 and two.ms(0.6e9, 26) == pytest.approx(points[0][2])
    with pytest.raises(HybridError, match="same CPU bytes"):
        DecodeModel.fit([(1e9, 26, 50.0), (1e9, 20, 40.0)])


def test_a_measured_fixed_part_is_kept_and_only_the_costs_are_fitted() -> None:
    from hybrid.tuning.predict import DecodeModel

    def truth(gb: float, n: int) -> float:
        return 10.0 + 40.0 * gb + 1.5 * n
    points = [(g * 1e9, n, truth(g, n)) for g, n in ((0.6, 26), (0.3, 26), (0.45, 20))]
    m = DecodeModel.fit(points, fixed_ms=10.0)
    assert (m.fixed_ms, m.ms_per_gb, m.ms_per_layer) == pytest.approx((10.0, 40.0, 1.5))
    assert m.fixed_measured and not DecodeModel.fit(points).fixed_measured
    # a fixed part below the two points' intercept (10): the line through it, least squares
    two = DecodeModel.fit(points[:2], fixed_ms=8.9)
    assert two.fixed_ms == 8.9 and two.ms(0.0) == 8.9 and two.ms_per_layer == 0.0
    gb, above = np.array([0.6, 0.3]), np.array([p[2] for p in points[:2]]) - 8.9
    assert two.ms_per_gb == pytest.approx(float(gb @ above / (gb @ gb)))  # 42.2
    with pytest.raises(HybridError, match="same CPU bytes"):
        DecodeModel.fit([(1e9, 26, 50.0), (1e9, 20, 40.0)], fixed_ms=5.0)


def test_experts_answered_at_once_call_no_cpu_kernel_and_are_undone(models,
                                                                    monkeypatch) -> None:
    """fixed_step_ms's steps (prompts and decodes) call no op's run_host; afterwards every op
    has the class's again (or what its instance held before) and the steps call it."""
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.ops.experts import ExpertsOp
    from hybrid.tuning.measure import answer_experts_at_once, fixed_step_ms, step_ms

    calls = []
    run_host = ExpertsOp.run_host
    monkeypatch.setattr(ExpertsOp, "run_host",
                        lambda op, *a: (calls.append(op), run_host(op, *a))[1])
    llm = LLM(str(models.path("tiny-v3", "q4_k_m")), "cpu.yaml",
              engine_config=EngineConfig(max_batch_size=2, prefix_cache=False))
    ops = [m for m in llm.engine.runner.model.modules() if isinstance(m, ExpertsOp)]
    assert len(ops) == 3 and llm.engine.runner.graphs is None  # tiny-v3: layers 1-3, no CUDA
    assert step_ms(llm, 2, 3) > 0
    assert {id(op) for op in calls} == {id(op) for op in ops}
    calls.clear()
    assert fixed_step_ms(llm, 2, 3) > 0
    assert calls == [] and not any("run_host" in vars(op) for op in ops)
    step_ms(llm, 1, 2)
    assert len(calls) >= 3 * 2
    mine = ops[0].run_host = lambda *a: None  # an instance's own: put back, not dropped
    undo = answer_experts_at_once(llm)
    assert ops[0].run_host is not mine
    undo()
    assert ops[0].run_host is mine


def test_whole_step_graphs_get_each_layers_flag_answered_at_once() -> None:
    """Whole-step graphs: the HostExperts' run raises each layer's done flag for the step the
    GPU raised the ready flags of, and the class's run is back after undo."""
    from hybrid.engine.step.host_experts import HostExperts
    from hybrid.tuning.measure import answer_experts_at_once

    flags = SimpleNamespace(ready=torch.zeros(3, dtype=torch.int64),
                            done=torch.zeros(3, dtype=torch.int64))
    host = HostExperts([SimpleNamespace(pool=None, placed=None)] * 3, flags)
    graphs = SimpleNamespace(whole_step=True, form=SimpleNamespace(host=host))
    llm = SimpleNamespace(engine=SimpleNamespace(runner=SimpleNamespace(
        model=torch.nn.Module(), graphs=graphs)))
    flags.ready[:] = 7  # the GPU reached every MoE layer of step 7
    undo = answer_experts_at_once(llm)
    host.prepare(7, 1)  # nothing bound, and no region for the beside thread to wait for
    host.wait_driving()
    host.run(7, 1)  # the class's would run the (absent) experts
    assert flags.done.tolist() == [7, 7, 7]
    undo()
    assert not {"run", "prepare", "wait_driving"} & set(vars(host))
    assert host.run.__func__ is HostExperts.run


def test_hot_experts_get_the_room_a_large_prefill_chunk_would_take() -> None:
    """explain counts the activations of the chunk the engine would choose; tune gives that
    room to hot experts (the engine then picks a chunk that fits what is left)."""
    from hybrid.rules.explain import DeviceTotal, Explanation
    from hybrid.tuning.planner import free_gpu_bytes

    gpu = DeviceTotal(weights=10, kv_cache=5, reserve=2, budget=100, prefill_chunk=1024,
                      activations=20)
    exp = Explanation([], {"cuda:0": gpu}, 4096, {}, [], [])
    assert gpu.total == 37 and free_gpu_bytes(exp, "cuda:0") == 83


def test_tune_on_a_machine_without_a_gpu_starts_from_the_familys_gpu_rules(skewed,
                                                                            capsys) -> None:
    """Tuning on a laptop for a GPU server: no --optimize-rules takes the family's bundled GPU
    rules (it took cpu.yaml here and said "no GPU budget for cuda:0" though one was passed)."""
    from cli.main import main

    path, root, _ = skewed
    out = root / "laptop.yaml"
    assert main(["tune", "--gguf-path", str(path), "--profile", str(root / "profile.json"),
                 "--gpu-memory", "24GiB", "--cache-lens", "1024", "--out", str(out),
                 "--no-plots"]) == 0
    assert "gpu_experts" in out.read_text()
    assert "DeepSeek-V3" in capsys.readouterr().out + out.read_text()


def test_a_budget_that_holds_no_expert_fails_at_once(skewed, capsys) -> None:
    """Before minutes of --measure: one line naming the room left and the smallest expert."""
    from cli.main import main

    path, root, _ = skewed
    code = main(["tune", "--gguf-path", str(path), "--optimize-rules", "DeepSeek-V3",
                 "--profile", str(root / "profile.json"), "--gpu-memory", "1MiB",
                 "--cache-lens", "1024", "--out", str(root / "none.yaml"), "--measure"])
    err = capsys.readouterr().err
    assert code == 2 and "not one expert" in err and "raise --gpu-memory" in err
    assert "measuring" not in err


def test_a_negative_cost_per_gb_is_flagged_not_printed_as_a_model(skewed) -> None:
    from hybrid.tuning.predict import DecodeModel
    from hybrid.tuning.report import summary
    from hybrid.tuning.results import TuneResult

    noise = DecodeModel.fit([(0.6e9, 26, 30.0), (0.3e9, 26, 34.0)])
    assert noise.is_noise and not DecodeModel.fit([(0.6e9, 26, 34.0), (0.3e9, 26, 30.0)]).is_noise
    _, root, profile = skewed
    result = TuneResult(root / "x.yaml", 0, profile.layers, profile.frequencies("decode"), {},
                        None, 20.0, model=noise)
    text = summary(result)
    assert "the step times are noise, not a model" in text and "time model:" not in text


def test_the_report_says_the_fixed_part_was_measured(skewed) -> None:
    from hybrid.tuning.predict import DecodeModel
    from hybrid.tuning.report import summary, to_json
    from hybrid.tuning.results import TuneResult

    _, root, profile = skewed
    for measured in (True, False):
        result = TuneResult(root / "x.yaml", 0, profile.layers, profile.frequencies("decode"),
                            {}, None, 20.0, model=DecodeModel(8.9, 40.0, 0.5, measured))
        line = next(x for x in summary(result).splitlines() if x.startswith("time model:"))
        assert line.startswith("time model: 8.90 ms fixed" + (
            " (measured: the tuned rules' step with its CPU experts answered at once) + 40.0 ms "
            "per GB" if measured else " + 40.0 ms per GB"))
        assert to_json(result)["model"]["fixed_measured"] is measured


def test_two_gpus_spread_the_hot_experts_and_keep_the_tokens(skewed, tmp_path, capsys) -> None:
    """`--gpu-memory A,B` over the one-GPU rules split by layers (layer 1 on cuda:0, layers
    2-3 on cuda:1), each GPU with room for 20 experts: each layer's hot experts on its own
    GPU; the rule file serves the same greedy tokens as the one-GPU exact rules (GPUs stood in
    for by the CPU)."""
    import yaml

    from cli.main import main
    from hybrid.engine.llm import LLM
    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.rules.explain import explain
    from hybrid.rules.layer_split import write_split
    from hybrid.rules.planner import plan_model, with_experts_mode
    from hybrid.tuning.planner import expert_bytes

    path, root, _ = skewed
    base = write_split(str(with_experts_mode("DeepSeek-V3", "exact", tmp_path)), [2],
                       ["cuda:0", "cuda:1"], 4, tmp_path)
    planned = plan_model(str(path), str(base), check_devices=False, announce=False)
    devices = explain(planned.plan, planned.spec, 1024, 24 << 30, None).devices
    sizes = expert_bytes(planned.plan, planned.spec.num_experts).per_layer
    room = 20 * max(sizes.values())
    budgets = [devices[d].total - devices[d].activations + room for d in ("cuda:0", "cuda:1")]
    out = tmp_path / "two.yaml"
    assert main(["tune", "--gguf-path", str(path), "--optimize-rules", str(base), "--profile",
                 str(root / "profile.json"), "--gpu-memory", ",".join(map(str, budgets)),
                 "--cache-lens", "1024", "--cpu-bandwidth", "50", "--no-plots",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hot experts by GPU: cuda:0:" in printed and "cuda:1:" in printed
    rules = [r for r in yaml.safe_load(out.read_text())
             if r["replace"]["kwargs"].get("gpu_experts")]
    held = {}
    for r in rules:
        kwargs, layer = r["replace"]["kwargs"], int(r["match"]["name"].split("\\.")[2])
        assert kwargs["gpu_device"] == ("cuda:0" if layer < 2 else "cuda:1")  # its own GPU
        held[kwargs["gpu_device"]] = held.get(kwargs["gpu_device"], 0) + \
            sizes[layer] * len(kwargs["gpu_experts"])
    assert set(held) == {"cuda:0", "cuda:1"} and max(held.values()) <= room
    # from the one-GPU rules, tune splits the layers itself (at the same layer)
    one_gpu = with_experts_mode("DeepSeek-V3", "exact", tmp_path)
    assert main(["tune", "--gguf-path", str(path), "--optimize-rules", str(one_gpu),
                 "--profile", str(root / "profile.json"), "--gpu-memory",
                 ",".join(map(str, budgets)), "--cache-lens", "1024", "--cpu-bandwidth", "50",
                 "--no-plots", "--out", str(tmp_path / "auto.yaml")]) == 0
    assert "split over cuda:0, cuda:1 at layer 2" in capsys.readouterr().err
    assert _held_devices(tmp_path / "auto.yaml") == _held_devices(out)
    # --measure: both placements decoded over the two GPUs, the time model fitted to them
    measured = tmp_path / "m.yaml"
    assert main(["tune", "--gguf-path", str(path), "--optimize-rules", str(base), "--profile",
                 str(root / "profile.json"), "--gpu-memory", ",".join(map(str, budgets)),
                 "--cache-lens", "1024", "--cpu-bandwidth", "50", "--no-plots", "--measure",
                 "--steps", "2", "--device-map", "cuda=cpu", "--out", str(measured)]) == 0
    report = json.loads(measured.with_suffix(".json").read_text())
    assert [p["name"] for p in report["placements"]] == ["none on the GPUs",
                                                         "hot experts on 2 GPUs"]
    assert all(p["measured_ms"] > 0 and p["predicted_ms"] for p in report["placements"])
    assert report["model"]["fixed_measured"]
    assert ("measuring decode: hot experts on 2 GPUs, then with its CPU experts answered at "
            "once") in capsys.readouterr().err

    prompts = [[0, 5, 9, 11, 300], [0, 17, 2, 90]]
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=0)
    one = LLM(str(path), str(with_experts_mode("DeepSeek-V3", "exact", tmp_path)),
              device_map={"cuda": "cpu"}).generate(prompt_token_ids=prompts,
                                                   sampling_params=params)
    two = LLM(str(path), str(out), device_map={"cuda": "cpu"}).generate(
        prompt_token_ids=prompts, sampling_params=params)
    for a, b in zip(one, two, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == pytest.approx(b.outputs[0].logprobs, abs=1e-4)


def _held_devices(rules) -> dict[int, str]:
    """Tuned layer -> the GPU its hot experts are held on, from a rule file."""
    import yaml

    return {int(r["match"]["name"].split("\\.")[2]): r["replace"]["kwargs"]["gpu_device"]
            for r in yaml.safe_load(Path(rules).read_text())
            if r["replace"]["kwargs"].get("gpu_experts")}


def test_spread_keeps_a_layers_experts_on_its_own_gpu() -> None:
    from hybrid.tuning.planner import ExpertBytes, spread_hot_experts

    freq = np.array([[0.9, 0.8, 0.7, 0.0], [0.6, 0.5, 0.0, 0.0], [0.4, 0.0, 0.0, 0.0]])
    sizes = ExpertBytes({1: 10, 2: 10, 3: 10}, (1, 2, 3))
    home = {1: "cuda:0", 2: "cuda:0", 3: "cuda:1"}
    # cuda:0's room takes the most used of layers 1 and 2; cuda:1's room stays with layer 3
    # (held elsewhere, a layer's experts would keep its decode steps out of CUDA graphs)
    got = spread_hot_experts(freq, (1, 2, 3), sizes, {"cuda:0": 40, "cuda:1": 30}, home)
    assert got == {1: ("cuda:0", [0, 1, 2]), 2: ("cuda:0", [0]), 3: ("cuda:1", [0])}
    got = spread_hot_experts(freq, (1, 2, 3), sizes, {"cuda:0": 20, "cuda:1": 10}, home)
    assert got == {1: ("cuda:0", [0, 1]), 3: ("cuda:1", [0])}
    # a layer whose attention runs on no budgeted GPU goes with the roomiest
    got = spread_hot_experts(freq, (1, 2, 3), sizes, {"cuda:0": 10, "cuda:1": 30},
                             {1: "cuda:0", 2: "cpu", 3: "cuda:1"})
    assert got == {1: ("cuda:0", [0]), 2: ("cuda:1", [0, 1]), 3: ("cuda:1", [0])}
