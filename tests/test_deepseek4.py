"""DeepSeek-V4 files (`deepseek4`): make-model writes what llama.cpp's converter writes, hybrid's
loader reads it into transformers' DeepseekV4 model, and llama.cpp (llama-cpp-python 0.3.36
runs deepseek4) computes the same logits from the same file: an oracle of the file's names,
keys and types independent of our loader. The prompt is long enough for every V4 branch to
act: past the 16-token window, past 128 tokens (the HCA layer's first compressed key) and past
4 x top-k (the CSA indexer prunes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybrid.errors import GGUFError, HybridError
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.loader import load_model
from hybrid.model.spec import read_spec
from hybrid.model.spec_v4 import V4Spec, read_v4_spec
from hybrid.model.tensor_map_v4 import expected_v4_shapes
from hybrid.synth.presets_v4 import TINY_V4, V4, with_layers

from .oracles import llama_cpp_logits, rel_l2

_rng = np.random.default_rng(0)
PROMPT = [1, *map(int, _rng.integers(3, 1000, size=199))]


@pytest.mark.parametrize("quant,bar", [("f32", 1e-5), ("mxfp4_moe", 5e-2), ("q4_k_m", 5e-2)])
def test_logits_match_llama_cpp(models, quant: str, bar: float) -> None:
    """f32 measured 2.8e-7; the mxfp4_moe mix (MXFP4 experts, Q8_0 and BF16 elsewhere) 0.025,
    llama.cpp's 8-bit activations; q4_k_m 0.018 (the tiny rows take Q5_0 and Q8_0 where the
    K-quants need 256 columns)."""
    pytest.importorskip("llama_cpp")
    path = str(models.path("tiny-v4", quant))
    loaded = load_model(path)
    assert type(loaded.model).__name__ == "DeepseekV4ForCausalLM"
    with torch.inference_mode():
        ours = loaded.model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()  # [T, V]
    assert rel_l2(ours, llama_cpp_logits(path, PROMPT)) <= bar
    assert ours.std() > 1.0  # the synthetic weights give varied logits, not a flat row


def test_file_has_the_converters_keys_and_types(models) -> None:
    gguf = GGUFModelFile(str(models.path("tiny-v4", "mxfp4_moe")))
    spec = read_spec(gguf)
    assert isinstance(spec, V4Spec) and spec.compress_ratios == (0, 4, 128)
    types = {name: info.qtype for name, (info, _) in gguf.tensor_infos.items()}
    assert set(types) == set(expected_v4_shapes(spec))  # llama.cpp loads exactly these
    # the converter's types: experts MXFP4, FP8 weights Q8_0, BF16 ones BF16, tables I32
    assert types["blk.0.ffn_gate_exps.weight"] == 39 and types["blk.1.attn_q_b.weight"] == 8
    assert types["blk.1.attn_compressor_kv.weight"] == 30 and types["output.weight"] == 30
    assert types["blk.0.ffn_gate_tid2eid.weight"] == 26
    assert types["blk.0.hc_attn_fn.weight"] == 0 and types["blk.2.attn_compressor_ape.weight"] == 0
    assert "blk.0.exp_probs_b.bias" not in types and "blk.1.exp_probs_b.bias" in types
    assert "blk.0.attn_compressor_kv.weight" not in types  # a window-only layer
    assert "blk.2.indexer.proj.weight" not in types  # HCA: no indexer
    md = gguf.metadata
    assert md["deepseek4.expert_gating_func"] == 4
    assert list(md["deepseek4.swiglu_clamp_exp"]) == [10.0] * 3


def test_token_id_routing_tables_load_as_expert_ids(models) -> None:
    model = load_model(str(models.path("tiny-v4", "f32"))).model
    table = model.model.layers[0].mlp.gate.tid2eid  # [V, K]
    assert table.dtype == torch.int64 and table.shape == (TINY_V4.vocab_size, 2)
    assert int(table.min()) >= 0 and int(table.max()) < TINY_V4.num_experts
    assert all(len(set(row)) == 2 for row in table.tolist())  # K distinct experts a token


def _keys(**changed):
    s = TINY_V4
    values = {"block_count": 3, "attention.compress_ratios": [0, 4, 128],
              "swiglu_clamp_exp": [10.0] * 3, "embedding_length": 64,
              "attention.head_count": 4, "attention.key_length": 64, "rope.dimension_count": 16,
              "attention.q_lora_rank": 32, "attention.output_group_count": 2,
              "attention.output_lora_rank": 16, "attention.sliding_window": 16,
              "attention.indexer.head_count": 8, "attention.indexer.key_length": 64,
              "attention.indexer.top_k": 4, "expert_count": 8, "expert_used_count": 2,
              "expert_feed_forward_length": 32, "expert_weights_scale": 1.5,
              "hash_layer_count": 1, "hyper_connection.count": 4,
              "hyper_connection.sinkhorn_iterations": 20, "hyper_connection.epsilon": 1e-6,
              "attention.layer_norm_rms_epsilon": 1e-6, "attention.compress_rope_freq_base":
              s.compress_rope_theta, "expert_gating_func": 4, **changed}
    values = {k: v for k, v in values.items() if v is not ...}  # `...`: the key is absent

    def key(name, default=...):
        if name in values:
            return values[name]
        if default is ...:
            raise GGUFError(f"metadata key deepseek4.{name} is missing")
        return default
    return key


def test_spec_reads_the_keys_and_names_what_is_wrong() -> None:
    spec = read_v4_spec("f.gguf", _keys(), 1024, "tiny")
    assert spec.layer_types == ["sliding_attention", "compressed_sparse_attention",
                                "heavily_compressed_attention"]
    config = spec.to_hf_config()
    assert config.mlp_layer_types == ["hash_moe", "moe", "moe"] and config.qk_rope_head_dim == 16
    for changed, words in [({"expert_gating_func": 2}, "expert_gating_func must be 4"),
                           ({"attention.compress_ratios": [0, 8, 128]}, "each must be 0, 4 or 128"),
                           ({"hyper_connection.count": 2}, "hyper_connection.count is 2"),
                           ({"attention.output_group_count": 3}, "not a multiple"),
                           ({"expert_shared_count": 2}, "expert_shared_count must be 1")]:
        with pytest.raises(GGUFError, match=words):
            read_v4_spec("f.gguf", _keys(**changed), 1024, "tiny")
    with pytest.raises(GGUFError, match="hash_layer_count is missing"):
        read_v4_spec("f.gguf", _keys(hash_layer_count=...), 1024, "tiny")


def test_v4_defaults_to_its_bundled_cpu_rules(models) -> None:
    """Without a GPU: every module transformers' own but the routed experts, on the CPU
    kernels (serving: tests/test_v4_serving.py)."""
    from hybrid.rules.planner import plan_model

    if torch.cuda.is_available():
        pytest.skip("a GPU's default is DeepSeek-V4.yaml (the next test)")
    planned = plan_model(str(models.path("tiny-v4", "f32")), None, announce=False)
    assert planned.rules_path.name == "DeepSeek-V4-cpu.yaml" and planned.plan.warnings == []
    ops = {p.path: (p.operator, p.generate_device) for p in planned.plan.placements.values()}
    experts = [k for k, v in ops.items() if v[0] == "experts"]
    assert experts == [f"model.layers.{i}.mlp.experts" for i in range(TINY_V4.num_layers)]
    assert {v for k, v in ops.items() if k not in experts} == {("default", "cpu")}


def test_v4_gpu_rules_put_every_linear_layer_on_the_gpu(models) -> None:
    """The bundled DeepSeek-V4.yaml (a GPU's default): the routed experts on the CPU kernels,
    every linear layer (the grouped output projection too), the embedding and the head on
    the GPU in the file's blocks, the rest transformers' modules on the GPU."""
    from hybrid.model.spec import read_spec
    from hybrid.rules.planner import family_gpu_rules_name, plan_model

    path = str(models.path("tiny-v4", "q4_k_m"))
    assert family_gpu_rules_name(read_spec(GGUFModelFile(path))) == "DeepSeek-V4.yaml"
    plan = plan_model(path, "DeepSeek-V4", check_devices=False, announce=False).plan
    assert plan.warnings == []
    ops = {p.path: (p.operator, p.generate_device) for p in plan.placements.values()}
    model = load_model(path).model
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind == "DeepseekV4GroupedLinear":
            assert ops[name] == ("grouped_linear", "cuda:0"), name
        elif kind == "Linear":
            assert ops[name] == ("lm_head" if name == "lm_head" else "linear", "cuda:0"), name
    assert ops["model.embed_tokens"] == ("embedding", "cuda:0")
    assert {v for k, v in ops.items() if k.endswith(".mlp.experts")} == {("experts", "cpu")}
    assert {v[1] for k, v in ops.items() if not k.endswith(".mlp.experts")} == {"cuda:0"}


@pytest.mark.parametrize("quant", ["f32", "q4_k_m", "mxfp4_moe"])
def test_v4_gpu_rules_equal_transformers(models, tmp_path, quant: str) -> None:
    """The GPU layout's operators (the GPU moved to the CPU, torch's kernels; gpu_kernels':
    tests/gpu_kernels/test_deepseek4_gpu_path.py) on the file's blocks, exact experts: the
    logits of transformers on the dequantized weights."""
    from hybrid.rules.inject import inject
    from hybrid.rules.planner import plan_model, with_experts_mode

    path = str(models.path("tiny-v4", quant))
    rules = with_experts_mode("DeepSeek-V4", "exact", tmp_path)
    model = inject(plan_model(path, str(rules), device_map={"cuda": "cpu"}, announce=False))
    assert type(model.get_submodule("model.layers.1.self_attn.o_a_proj")).__name__ \
        == "GroupedLinearOp"
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        ours = model(input_ids=ids).logits[0].numpy()  # [T, V]
        ref = load_model(path).model(input_ids=ids).logits[0].numpy()
    assert rel_l2(ours, ref) <= 1e-5


def test_presets_keep_a_csa_layer_and_the_flash_shapes() -> None:
    assert with_layers(TINY_V4, 5).compress_ratios == (0, 4, 128, 128, 128)
    with pytest.raises(HybridError, match="no CSA layer"):
        with_layers(TINY_V4, 1)
    shapes = expected_v4_shapes(V4)
    assert shapes["blk.2.attn_output_a.weight"] == (8 * 1024, 64 * 512 // 8)
    assert shapes["blk.3.attn_compressor_kv.weight"] == (2 * 512, 4096)  # CSA: two series
    assert shapes["blk.2.attn_compressor_ape.weight"] == (128, 512)  # HCA
    assert shapes["blk.0.ffn_gate_tid2eid.weight"] == (129280, 6)


V4_CPU_EXPERTS = """\
- match: {name: "^model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.experts$", class: DeepseekV4Experts}
  replace: {class: experts, kwargs: {generate_device: cpu, backend: cpu, mode: MODE}}
  recursive: false
- match: {name: ""}
  replace: {class: default, kwargs: {generate_device: cpu}}
"""


@pytest.mark.parametrize("quant,mode,bar", [("f32", "exact", 1e-6), ("mxfp4_moe", "exact", 1e-5),
                                            ("mxfp4_moe", "fast", 2e-2)])
def test_rules_run_v4_experts_on_the_cpu_kernels(models, tmp_path, quant, mode, bar) -> None:
    """A rule file of the user's puts V4's routed experts on hybrid's experts operator (the
    rest transformers' own modules): the same logits as transformers on the dequantized
    weights. MXFP4 experts run the CPU kernels (clamped SwiGLU, exact or fast); F32 ones,
    which cpu_kernels does not read, the torch loop with the same clamp."""
    from hybrid.rules.inject import inject
    from hybrid.rules.planner import plan_model

    rules = tmp_path / "v4-cpu-experts.yaml"
    rules.write_text(V4_CPU_EXPERTS.replace("MODE", mode))
    path = str(models.path("tiny-v4", quant))
    model = inject(plan_model(path, str(rules), announce=False))
    experts = model.get_submodule("model.layers.0.mlp.experts")
    assert type(experts).__name__ == "ExpertsOp" and experts.swiglu_limit == 10.0
    assert experts.backend == ("torch" if quant == "f32" else "cpu")
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        ours = model(input_ids=ids).logits[0].numpy()  # [T, V]
        ref = load_model(path).model(input_ids=ids).logits[0].numpy()
    assert rel_l2(ours, ref) <= bar



