"""`hybrid rules explain` on a full-size DeepSeek-V3 Q4_K_M (headers only, sparse data) and on
the tiny models; bundled rules plan every module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cli.main import main
from hybrid.rules.explain import parse_size
from hybrid.rules.planner import bundled_rules, plan_model
from hybrid.synth.make_model import MakeModelOptions, make_model
from hybrid.synth.presets import get_preset
from hybrid.synth.vocab import get_vocab

GIB = 2**30


def _full_size(tmp_path_factory: pytest.TempPathFactory, preset_name: str, layout: str,
               name: str) -> Path:
    """A full-size header-only Q4_K_M file of `preset_name` (sparse: no weight bytes)."""
    preset = get_preset(preset_name)
    out = tmp_path_factory.mktemp(preset_name) / name
    opts = MakeModelOptions(preset, "q4_k_m", layout, vocab="deepseek", header_only=True)
    (path,) = make_model(opts, get_vocab("deepseek", preset.vocab_size), out)
    return path


@pytest.fixture(scope="module")
def v3_sparse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _full_size(tmp_path_factory, "v3", "legacy", "DeepSeek-V3-Q4_K_M.gguf")


def explain_json(capsys, *argv: str) -> dict:
    """The JSON; the exit status says the verdict (0 fits, 1 does not)."""
    code = main(["rules", "explain", *argv, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out["fits"] else 1)
    return out


def test_full_v3_q4_k_m_on_24_gib(capsys, v3_sparse: Path) -> None:
    assert v3_sparse.stat().st_blocks * 512 < 64 * 2**20  # sparse: headers only on disk
    out = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules", "DeepSeek-V3",
                       "--cache-lens", "32768", "--gpu-memory", "24GiB", "--cpu-memory", "512GiB")
    cpu, gpu = out["devices"]["cpu"], out["devices"]["cuda:0"]
    total_weights = sum(g["bytes"] for g in out["groups"])  # the GGUF's bytes
    assert abs(total_weights / GIB - 376.65) / 376.65 < 0.01
    experts = sum(g["bytes"] for g in out["groups"] if g["operator"] == "experts")
    assert abs(experts / GIB - 366.9) < 0.5
    # fast mode: RAM holds the packed copy (Q4_K 1.056x, Q6_K 1.010x), not the blocks
    packed = out["packed_experts"]
    assert packed["gguf_bytes"] == experts and cpu["weights"] == packed["packed_bytes"]
    assert 1.03 < packed["packed_bytes"] / experts < 1.06
    assert 9.5 < gpu["weights"] / GIB < 10.0
    assert out["kv_bytes_per_token"] == {"cuda:0": 61 * 576 * 2}  # 70,272 B: 70 KB per token
    assert gpu["kv_cache"] == 61 * 576 * 2 * 32768
    assert gpu["total"] == gpu["weights"] + gpu["kv_cache"] + gpu["reserve"] + \
        gpu["activations"]
    assert out["fits"] is True and gpu["budget"] == 24 * GIB
    # experts on the CPU: prompt steps may stream them, so the engine's chunk is as large as a
    # quarter of what is left allows (model/activations.py), counted beyond the reserve
    per_token = 4 * (4 * 7168 + 8 * (3 * 2048 + 7168))  # the routed rows: 528 KiB a token
    left = gpu["budget"] - gpu["weights"] - gpu["kv_cache"] - gpu["reserve"]
    assert gpu["prefill_chunk"] == min(8192, left // 4 // per_token) // 256 * 256 == 5120
    assert gpu["activations"] == (5120 - 512) * per_token
    assert cpu["prefill_chunk"] is None and cpu["activations"] == 0


@pytest.fixture(scope="module")
def v32_sparse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _full_size(tmp_path_factory, "v32", "mla", "DeepSeek-V3.2-Q4_K_M.gguf")


@pytest.mark.parametrize("cache_lens,chunk", [(32768, 4608), (131072, 768)])
def test_full_v32_q4_k_m_on_24_gib(capsys, v32_sparse: Path, cache_lens: int,
                                   chunk: int) -> None:
    """DeepSeek-V3.2.yaml on a full-size V3.2 Q4_K_M: every figure against the file itself.
    The GPU holds every tensor but the routed experts' (attention with the indexer, dense and
    shared MLPs, router, norms, embeddings, head) in the file's own blocks; per token and layer
    its cache holds the latent (512), the rotated key (64) and the indexer's key (128) in bf16.
    Both 32K and 128K tokens fit 24 GiB; 128K with 1.7 GiB to spare, so the prompt chunk the
    engine would pick shrinks to 768 tokens."""
    from hybrid.gguf.reader import GGUFModelFile

    assert v32_sparse.stat().st_blocks * 512 < 64 * 2**20  # sparse: headers only on disk
    out = explain_json(capsys, "--gguf-path", str(v32_sparse), "--optimize-rules",
                       "DeepSeek-V3.2", "--cache-lens", str(cache_lens), "--gpu-memory", "24GiB",
                       "--cpu-memory", "512GiB")
    infos = {name: entry[0] for name, entry in GGUFModelFile(v32_sparse).tensor_infos.items()}
    # per layer 9 attention, 5 indexer tensors and ffn_norm; 3 dense MLPs; 58 MoE blocks of
    # router, bias, shared and routed experts: no MTP block (blk.61) in this file
    assert len(infos) == 3 + 61 * 15 + 3 * 3 + 58 * 8
    experts = {n for n in infos if n.endswith("_exps.weight")}
    assert len(experts) == 58 * 3
    gpu_bytes = sum(i.nbytes for n, i in infos.items() if n not in experts)
    expert_bytes = sum(infos[n].nbytes for n in experts)
    cpu, gpu = out["devices"]["cpu"], out["devices"]["cuda:0"]
    assert set(out["devices"]) == {"cpu", "cuda:0"}
    assert gpu["weights"] == gpu_bytes == 10_984_326_144  # 10.23 GiB
    assert out["packed_experts"]["gguf_bytes"] == expert_bytes
    assert sum(g["bytes"] for g in out["groups"]) == gpu_bytes + expert_bytes
    attention = sum(i.nbytes for n, i in infos.items() if (".attn_" in n or ".indexer." in n)
                    and not n.endswith(".attn_norm.weight"))  # attn_norm: the layer's input norm
    assert sum(g["bytes"] for g in out["groups"] if g["operator"] == "mla_attention") == attention
    per_token = 61 * (512 + 64 + 128) * 2
    assert out["kv_bytes_per_token"] == {"cuda:0": per_token} and per_token == 85_888
    assert gpu["kv_cache"] == per_token * cache_lens
    assert gpu["reserve"] == int(1.5 * GIB)
    # the routed rows of a prompt chunk that may stream CPU experts (as for V3)
    act = 4 * (4 * 7168 + 8 * (3 * 2048 + 7168))
    left = 24 * GIB - gpu_bytes - per_token * cache_lens - int(1.5 * GIB)
    assert gpu["prefill_chunk"] == min(8192, left // 4 // act) // 256 * 256 == chunk
    assert gpu["activations"] == (chunk - 512) * act
    assert gpu["total"] == gpu_bytes + per_token * cache_lens + int(1.5 * GIB) + \
        (chunk - 512) * act
    assert gpu["fits"] is True and gpu["total"] <= gpu["budget"] == 24 * GIB
    assert cpu["fits"] is True and out["fits"] is True
    # hybrid serve's own KV cache on this budget: a third of what weights and reserve leave
    serve = (24 * GIB - gpu_bytes - int(1.5 * GIB)) // 3 // per_token // 64 * 64
    assert out["serve_cache_lens"] == {"cuda:0": serve} and 32768 < serve < 163840


def test_v32_default_gpu_rules_place_the_indexer_on_the_gpu(v32_sparse: Path,
                                                            monkeypatch) -> None:
    """On a GPU machine a deepseek32 file defaults to DeepSeek-V3.2.yaml (V3's file names V3's
    classes): attention and its indexer on the GPU, the routed experts on the CPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    planned = plan_model(str(v32_sparse), None, check_devices=False, announce=False)
    assert planned.rules_path.name == "DeepSeek-V3.2.yaml" and planned.plan.warnings == []
    ops = {p.path: (p.operator, p.generate_device) for p in planned.plan.placements.values()}
    assert ops["model.layers.0.self_attn"] == ("mla_attention", "cuda:0")
    assert planned.plan.owners["model.layers.0.self_attn.indexer.k_norm"] == \
        "model.layers.0.self_attn"
    assert ops["model.layers.3.mlp.experts"] == ("experts", "cpu")
    for path in ("model.layers.3.mlp.gate", "model.layers.3.mlp.shared_experts",
                 "model.layers.0.mlp", "model.norm", "lm_head", "model.embed_tokens"):
        assert ops[path][1] == "cuda:0", path


def test_over_budget_names_items_and_a_fix(capsys, v3_sparse: Path) -> None:
    out = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules", "DeepSeek-V3",
                       "--cache-lens", "163840", "--gpu-memory", "16GiB", "--cpu-memory", "512GiB")
    assert out["fits"] is False and out["devices"]["cuda:0"]["fits"] is False
    assert any("cuda:0 is over its 16.00 GiB budget" in a and "model.layers.*.self_attn" in a
               for a in out["advice"])
    fix = next(a for a in out["advice"] if a.startswith("fits with --cache-lens"))
    lens = int(fix.split()[3])
    again = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules", "DeepSeek-V3",
                         "--cache-lens", str(lens), "--gpu-memory", "16GiB", "--cpu-memory", "512GiB")
    assert again["fits"] is True


def test_gpu_experts_move_bytes_to_the_gpu(capsys, v3_sparse: Path) -> None:
    out = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules",
                       "DeepSeek-V3-gpu-experts", "--cache-lens", "4096", "--cpu-memory", "512GiB")
    gpu_experts = sum(g["bytes"] for g in out["groups"]
                      if g["operator"] == "experts" and g["device"] == "cuda:0")
    # Layers 3 and 4 whole (2 x 256 experts) plus 8 of 256 experts in the other 56 MoE layers;
    # per-layer sizes differ a little (Q6_K ffn_down in some layers), hence 5%.
    per_expert_layer = 366.9 * GIB / 58 / 256
    assert abs(gpu_experts / per_expert_layer / (2 * 256 + 56 * 8) - 1) < 0.05
    assert out["fits"] is False  # ~30 GiB of experts: the tool says so before any loading


def test_gpu_experts_in_host_memory_stay_on_the_host(capsys, v3_sparse: Path,
                                                    tmp_path: Path) -> None:
    """`gpu_experts_memory: host`: the GPU reads the held experts over PCIe, so their bytes
    count against the host's memory, not the GPU's."""
    from hybrid.rules.planner import with_gpu_experts

    rules = with_gpu_experts("DeepSeek-V3", list(range(8)), "host", tmp_path)
    out = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules", str(rules),
                       "--cache-lens", "4096", "--cpu-memory", "512GiB")
    assert not any(g["operator"] == "experts" and g["device"] == "cuda:0"
                   for g in out["groups"])
    base = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules",
                        "DeepSeek-V3", "--cache-lens", "4096", "--cpu-memory", "512GiB")
    # the GPU: one staging buffer, the largest layer's held experts; the host: the CPU's packed
    # copy of every expert and the page-locked copy of the held ones
    held = out["host_experts"]
    assert held["layers"] == 58
    layer = held["staging_bytes"]["cuda:0"]
    assert out["devices"]["cuda:0"]["weights"] == base["devices"]["cuda:0"]["weights"] + layer
    assert abs(layer / (366.9 * GIB / 58 * 8 / 256) - 1) < 0.1  # the largest: Q6_K down
    assert out["devices"]["cpu"]["weights"] == base["devices"]["cpu"]["weights"] + \
        held["pinned_bytes"]
    main(["rules", "explain", "--gguf-path", str(v3_sparse), "--optimize-rules", str(rules),
          "--cache-lens", "4096", "--cpu-memory", "512GiB"])
    assert "GPU experts in host memory: 58 MoE layers" in capsys.readouterr().out


def test_multi_gpu_splits_layers(capsys, v3_sparse: Path) -> None:
    out = explain_json(capsys, "--gguf-path", str(v3_sparse), "--optimize-rules",
                       "DeepSeek-V3-multi-gpu", "--cpu-memory", "512GiB")
    assert set(out["devices"]) == {"cpu", "cuda:0", "cuda:1"}
    assert out["kv_bytes_per_token"] == {"cuda:0": 30 * 1152, "cuda:1": 31 * 1152}


def test_table_output(capsys, v3_sparse: Path) -> None:
    assert main(["rules", "explain", "--gguf-path", str(v3_sparse), "--optimize-rules",
                 "DeepSeek-V3", "--cpu-memory", "512GiB"]) == 0
    text = capsys.readouterr().out
    assert "model.layers.*.mlp.experts" in text and "verdict: fits" in text
    assert "fast-mode CPU experts: a packed copy of" in text and "as the packed cache" in text
    assert "70,272 bytes per token on cuda:0" in text


@pytest.mark.parametrize("preset,rules", [
    ("tiny-v3", "cpu.yaml"), ("tiny-v2-lite", "cpu.yaml"), ("tiny-v3", "DeepSeek-V3.yaml"),
    ("tiny-v2-lite", "DeepSeek-V2-Lite.yaml"), ("tiny-v3", "DeepSeek-V3-gpu-experts.yaml"),
    ("tiny-v2-lite", "DeepSeek-V2-Lite-gpu.yaml"),
])
def test_bundled_rules_place_every_module(models, preset: str, rules: str) -> None:
    planned = plan_model(str(models.path(preset, "q4_k_m")), rules, check_devices=False,
                         announce=False)
    plan = planned.plan
    ops = {p.operator for p in plan.placements.values()}
    assert {"embedding", "mla_attention", "experts", "gate", "mlp", "rmsnorm", "lm_head"} <= ops
    experts = [p for p in plan.placements.values() if p.operator == "experts"]
    assert len(experts) == planned.spec.num_layers - planned.spec.first_k_dense
    # Every parameter is owned by some placement and counted once per device it lives on.
    assert {w.param for w in plan.weights} == {
        n for n, _ in planned.model.named_parameters(remove_duplicate=False)
    } | {n for n, _ in planned.model.named_buffers() if n.endswith("e_score_correction_bias")}
    assert plan.warnings == []
    if rules == "DeepSeek-V3-gpu-experts.yaml":
        layer3 = plan.placements["model.layers.3.mlp.experts"]
        assert (layer3.options["backend"], layer3.generate_device) == ("torch", "cuda:0")
        assert plan.placements["model.layers.1.mlp.experts"].options["gpu_experts"] == list(range(8))
    if rules == "DeepSeek-V2-Lite-gpu.yaml":  # nothing left on the CPU
        assert {(p.generate_device, p.prefill_device) for p in plan.placements.values()
                if p.operator != "default"} == {("cuda:0", "cuda:0")}



def test_shadowed_rules_are_not_warned_but_dead_ones_are(models, tmp_path) -> None:
    """A tuned file puts a rule per MoE layer in front of the base file: the base's catch-all
    experts rule then places nothing, but it matches, so no warning; a rule matching no module
    (a typo) still warns."""
    from hybrid.rules.planner import find_rules

    path = models.path("tiny-v3", "q4_k_m")
    spec_layers = plan_model(str(path), "cpu.yaml", check_devices=False, announce=False).spec
    front = [{"match": {"name": f"^model\\.layers\\.{i}\\.mlp\\.experts$"},
              "replace": {"class": "experts", "kwargs": {"mode": "exact"}}, "recursive": False}
             for i in range(spec_layers.first_k_dense, spec_layers.num_layers)]
    typo = [{"match": {"name": "^model\\.layerz\\.0$"}, "replace": {"class": "default"}}]
    base = find_rules("cpu.yaml").read_text()
    for extra, warned in (([], 0), (typo, 1)):
        rules = tmp_path / f"r{warned}.yaml"
        rules.write_text(yaml.safe_dump(front + extra, sort_keys=False) + base)
        plan = plan_model(str(path), str(rules), check_devices=False, announce=False).plan
        assert len(plan.warnings) == warned, plan.warnings
        assert all("layerz" in w for w in plan.warnings)

def test_bundled_files_exist() -> None:
    assert set(bundled_rules()) == {"cpu.yaml", "DeepSeek-V3.yaml", "DeepSeek-V3.2.yaml",
                                    "DeepSeek-V2-Lite.yaml",
                                    "DeepSeek-V2-Lite-gpu.yaml", "DeepSeek-V3-multi-gpu.yaml",
                                    "DeepSeek-V3-gpu-experts.yaml", "DeepSeek-V4.yaml",
                                    "DeepSeek-V4-cpu.yaml"}


def test_cuda_rules_without_a_gpu_suggest_cpu_yaml(models) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from hybrid.errors import HybridError

    with pytest.raises(HybridError, match="has no CUDA GPU; use --optimize-rules cpu.yaml"):
        plan_model(str(models.path("tiny-v3", "q4_k_m")), "DeepSeek-V3.yaml", announce=False)


def test_default_rules_on_this_machine(models, capsys) -> None:
    import torch

    planned = plan_model(str(models.path("tiny-v3", "q4_k_m")), None)
    expected = "DeepSeek-V3.yaml" if torch.cuda.is_available() else "cpu.yaml"
    assert planned.rules_path.name == expected
    assert f"using optimize rules {expected}" in capsys.readouterr().err


def test_operator_on_wrong_module_is_an_error(models, tmp_path: Path) -> None:
    from hybrid.rules.schema import RuleError

    rules = tmp_path / "bad.yaml"
    rules.write_text('- match: {name: "^model\\\\.layers\\\\.0\\\\.self_attn$"}\n'
                     "  replace: {class: experts}\n")
    with pytest.raises(RuleError, match=r"bad.yaml:1: rule 1: operator 'experts' cannot replace "
                                        r"model.layers.0.self_attn \(DeepseekV3Attention\)"):
        plan_model(str(models.path("tiny-v3", "q4_k_m")), str(rules), announce=False)


@pytest.mark.parametrize("text,value", [("24GiB", 24 * GIB), ("80GB", 80 * 10**9),
                                        ("1.5GiB", int(1.5 * GIB)), ("1024", 1024)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_loading_refuses_a_plan_over_budget(v3_sparse: Path) -> None:
    from hybrid.errors import HybridError
    from hybrid.rules.explain import refuse_if_over_budget

    planned = plan_model(str(v3_sparse), "DeepSeek-V3", check_devices=False, announce=False)
    refuse_if_over_budget(planned.plan, planned.spec, 32768, gpu_memory=24 * GIB)  # fits
    with pytest.raises(HybridError, match="does not fit: cuda:0 is over its 12.00 GiB budget"):
        refuse_if_over_budget(planned.plan, planned.spec, 32768, gpu_memory=12 * GIB)
    cpu = plan_model(str(v3_sparse), "cpu", check_devices=False, announce=False)
    refuse_if_over_budget(cpu.plan, cpu.spec, 32768, gpu_memory=1)  # no GPU in the plan


def test_a_gpu_holding_only_a_staging_buffer_reads_its_own_budget(models, tmp_path,
                                                                   monkeypatch) -> None:
    """CPU rules with experts held in host memory for cuda:0: no weight lies on the GPU, yet
    its staging buffer and reserve do, so its budget is read from the device (not taken as
    0, which refused every such start on the GPU machine)."""
    import types

    import torch

    from hybrid.rules.explain import refuse_if_over_budget
    from hybrid.rules.planner import with_gpu_experts

    rules = with_gpu_experts("cpu", [1, 5, 9], "host", tmp_path, device="cuda:0")
    planned = plan_model(str(models.path("tiny-v3", "q4_k_m", "legacy")), str(rules),
                         check_devices=False, announce=False)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: asked.append(i) or
                        types.SimpleNamespace(total_memory=80 * GIB))
    refuse_if_over_budget(planned.plan, planned.spec, 4096)
    assert asked == [0]


def test_explain_defaults_to_the_demo_model_and_any_case_of_a_bundled_name(capsys) -> None:
    assert main(["rules", "explain", "--optimize-rules", "CPU", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"].endswith(".gguf") and "demo" in out["model"]
    assert out["rules"].endswith("cpu.yaml")


def test_explain_exits_1_when_it_does_not_fit(capsys, v3_sparse: Path) -> None:
    assert main(["rules", "explain", "--gguf-path", str(v3_sparse), "--optimize-rules",
                 "deepseek-v3", "--gpu-memory", "4GiB", "--cpu-memory", "512GiB"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("verdict: does not fit")


def test_loading_checks_the_plan_with_the_engines_kv_cache(models, monkeypatch) -> None:
    """The check before loading counts the KV cache the engine will allocate (it counted 4096
    tokens whatever --cache-lens said, so a plan could pass and then not fit)."""
    import hybrid.rules.load
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM

    seen = []
    monkeypatch.setattr(hybrid.rules.load, "refuse_if_over_budget",
                        lambda plan, spec, cache_lens, gpu_memory=None: seen.append(cache_lens))
    LLM(str(models.path("tiny-v3", "f32")), "cpu", engine_config=EngineConfig(cache_lens=8192))
    assert seen == [8192]


def test_a_cpu_share_over_the_machines_ram_is_said_before_loading(v3_sparse: Path,
                                                                  caplog) -> None:
    from hybrid.rules.explain import refuse_if_over_budget

    planned = plan_model(str(v3_sparse), "cpu", check_devices=False, announce=False)
    with caplog.at_level("WARNING", logger="hybrid.model"):
        refuse_if_over_budget(planned.plan, planned.spec, 4096)  # 377 GiB on a CI box: said
    assert "more than this machine's" in caplog.text and "GiB of RAM" in caplog.text


def test_one_budget_per_gpu(capsys, tmp_path) -> None:
    """--gpu-memory A,B: cuda:0's budget and cuda:1's; a GPU the rules use without one named
    is refused."""
    out = explain_json(capsys, "--optimize-rules", "DeepSeek-V3-multi-gpu", "--gpu-memory",
                       "2GiB,1GiB", "--cpu-memory", "8GiB")
    assert out["devices"]["cuda:0"]["budget"] == 2 * GIB
    assert out["devices"]["cuda:1"]["budget"] == GIB
    assert not out["devices"]["cuda:1"]["fits"] and out["devices"]["cuda:0"]["fits"]
    assert main(["rules", "explain", "--optimize-rules", "DeepSeek-V3-multi-gpu",
                 "--gpu-memory", "2GiB,", "--cpu-memory", "8GiB"]) != 0
