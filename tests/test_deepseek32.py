"""DeepSeek-V3.2 (GGUF architecture deepseek32): our loader reads a tiny-v32 file into
transformers' DeepseekV32ForCausalLM, and its logits equal transformers' fed gguf-py's
dequantized weights (and llama.cpp's) on a prompt longer than the indexer's top-k, where the
sparse attention differs from dense. Planning places the indexer with its attention, and the
engine serves it on the CPU rules with the same greedy tokens as transformers, chunked and
prefix-cached alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hybrid.errors import HybridError
from hybrid.model.loader import load_model, open_model
from hybrid.rules.planner import plan_model
from hybrid.synth.make_model import MakeModelOptions, make_model
from hybrid.synth.presets import get_preset
from hybrid.synth.vocab import get_vocab

from .oracles import rel_l2, transformers_greedy_cached, transformers_logits, transformers_model

PROMPT = [0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223, 736, 21, 1883, 17, 99, 1000,
          2500, 7]
TOPK = get_preset("tiny-v32").index_topk
assert len(PROMPT) > 2 * TOPK  # the later positions attend to a strict subset of the prompt


def test_spec_reads_the_indexer(models) -> None:
    _, spec = open_model(str(models.path("tiny-v32", "f32", "mla")))
    assert (spec.arch, spec.has_indexer) == ("deepseek32", True)
    assert (spec.index_n_heads, spec.index_head_dim, spec.index_topk) == (16, 64, 8)
    assert spec.num_layers == 4 and spec.layout == "mla" and spec.is_v3
    config = spec.to_hf_config()
    assert type(config).__name__ == "DeepseekV32Config"
    assert (config.index_n_heads, config.index_head_dim, config.index_topk) == (16, 64, 8)
    # deepseek2 files have no indexer and keep the V3 config
    _, v3 = open_model(str(models.path("tiny-v3", "f32", "mla")))
    assert (v3.arch, v3.has_indexer, v3.index_topk) == ("deepseek2", False, 0)
    assert type(v3.to_hf_config()).__name__ == "DeepseekV3Config"


def test_indexer_narrower_than_rope_is_refused(models, tmp_path) -> None:
    from hybrid.errors import GGUFError

    from .gguf_edit import rewrite

    bad = rewrite(models.path("tiny-v32", "f32", "mla"), tmp_path / "bad.gguf",
                  {"deepseek32.attention.indexer.key_length": 16})
    with pytest.raises(GGUFError, match="indexer key_length 16 is smaller than the rope "
                                        "dimension 32"):
        open_model(str(bad))


@pytest.mark.parametrize("quant", ["f32", "q4_k_m"])
def test_matches_transformers(models, quant: str) -> None:
    path = str(models.path("tiny-v32", quant, "mla"))
    loaded = load_model(path)
    assert type(loaded.model).__name__ == "DeepseekV32ForCausalLM"
    indexer = loaded.model.model.layers[0].self_attn.indexer
    assert indexer.k_norm.bias.abs().max() > 0  # the LayerNorm's bias came from the file
    with torch.inference_mode():
        ours = loaded.model(input_ids=torch.tensor([PROMPT])).logits[0].float()  # [T, V]
    oracle = transformers_model(loaded.spec, path)
    ref = transformers_logits(oracle, PROMPT)  # [T, V]
    for t in range(len(PROMPT)):
        assert rel_l2(ours[t].numpy(), ref[t].numpy()) <= 1e-5, f"position {t}"


def test_top_k_makes_attention_sparse(models) -> None:
    """The same weights with a top-k past the prompt (dense attention) agree up to position
    top-k - 1 and differ after it: the comparison above exercised the indexer's choice."""
    path = str(models.path("tiny-v32", "f32", "mla"))
    _, spec = open_model(path)
    sparse = transformers_logits(transformers_model(spec, path), PROMPT)
    dense_spec = dataclasses.replace(spec, index_topk=len(PROMPT))
    dense = transformers_logits(transformers_model(dense_spec, path), PROMPT)
    errors = [rel_l2(sparse[t].numpy(), dense[t].numpy()) for t in range(len(PROMPT))]
    assert max(errors[:TOPK]) < 1e-6
    assert min(errors[TOPK + 1:]) > 1e-2, errors


def test_matches_llama_cpp(models) -> None:
    """llama.cpp reads the same file (names, metadata, its NEOX indexer RoPE, the Hadamard-
    rotated indexer cache) and chooses the same tokens."""
    pytest.importorskip("llama_cpp")
    from .oracles import llama_cpp_logits

    path = str(models.path("tiny-v32", "f32", "mla"))
    with torch.inference_mode():
        ours = load_model(path).model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()
    theirs = llama_cpp_logits(path, PROMPT)
    errors = [rel_l2(theirs[t], ours[t]) for t in range(len(PROMPT))]
    assert max(errors) <= 1e-4, np.round(errors, 7)


def test_cpu_rules_place_the_indexer_with_its_attention(models) -> None:
    planned = plan_model(str(models.path("tiny-v32", "f32", "mla")), "cpu",
                         check_devices=False, announce=False)
    plan = planned.plan
    for i in range(planned.spec.num_layers):
        attention = f"model.layers.{i}.self_attn"
        assert plan.placement_of(attention).operator == "mla_attention"
        assert plan.owners[f"{attention}.indexer"] == attention
        assert plan.owners[f"{attention}.indexer.k_norm"] == attention
    indexer_weights = [w for w in plan.weights if ".indexer." in w.param]
    assert len(indexer_weights) == 5 * planned.spec.num_layers
    assert {w.device for w in indexer_weights} == {"cpu"}
    names = {g for w in indexer_weights for g in w.gguf_tensors}
    assert "blk.3.indexer.k_norm.bias" in names and "blk.0.indexer.attn_q_b.weight" in names


def test_rules_explain_plans_the_file(models, capsys) -> None:
    from cli.main import main

    path = str(models.path("tiny-v32", "f32", "mla"))
    assert main(["rules", "explain", "--gguf-path", path, "--optimize-rules", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "mla_attention" in captured.out and "verdict: fits" in captured.out
    assert "matches no module" not in captured.err  # cpu.yaml names V3.2's MLP and RMSNorm


def test_rules_explain_counts_the_indexer_keys(models) -> None:
    """Per token and layer the cache holds the latent, the rotated key and the indexer key."""
    from hybrid.rules.explain import explain

    planned = plan_model(str(models.path("tiny-v32", "f32", "mla")), "cpu",
                         check_devices=False, announce=False)
    spec = planned.spec
    exp = explain(planned.plan, spec, 1000, 0, None)
    width = spec.kv_lora_rank + spec.qk_rope_head_dim + spec.index_head_dim  # 128 + 32 + 64
    assert exp.kv_bytes_per_token == {"cpu": spec.num_layers * width * 4}  # kv_cache_dtype f32


# some prompts longer than the top-k (8), so their rows attend to strict subsets
SERVED = [PROMPT, [5, 9], [17, 300, 2, 44, 1000, 8], list(range(100, 131)), [7] * 10 + [3]]
MAX_TOKENS = 24


def _served(llm, prompts: list[list[int]]):
    from hybrid.engine.sampling.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    return [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


@pytest.fixture(scope="module", params=["f32", "q4_k_m"])
def served_file(models, request):
    """(path, transformers' greedy tokens and logprobs for each SERVED prompt, its oracle)."""
    path = str(models.path("tiny-v32", request.param, "mla"))
    _, spec = open_model(path)
    oracle = transformers_model(spec, path)
    return path, [transformers_greedy_cached(oracle, p, MAX_TOKENS) for p in SERVED], oracle


def test_served_on_the_cpu_matches_transformers(served_file, monkeypatch) -> None:
    """Five prompts in one batch (decodes beside prompt chunks): the indexer's keys paged by
    slot, every row's top-k, the sparse absorbed attention (a chunk's rows in blocks of 3)."""
    from hybrid.engine.llm import LLM
    from hybrid.ops.kernel_sets import torch_set

    monkeypatch.setattr(torch_set, "SPARSE_ROWS", 3)
    path, refs, _ = served_file
    outs = _served(LLM(path, "cpu"), SERVED)
    for i, (out, (tokens, logprobs)) in enumerate(zip(outs, refs)):
        assert out.token_ids == tokens, i
        assert max(abs(a - b) for a, b in zip(out.logprobs, logprobs)) <= 1e-3, i


def test_served_chunked_and_prefix_cached_keep_the_tokens(served_file) -> None:
    """Prompts cut into chunks of 3 tokens over pages of 4; then requests sharing a prefix
    with an earlier one read its pages (latents and indexer keys) from the prefix cache."""
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM

    path, refs, oracle = served_file
    llm = LLM(path, "cpu", engine_config=EngineConfig(page_size=4, chunk_size=3,
                                                      max_batch_size=4, prefix_cache=True))
    outs = _served(llm, SERVED[:3])
    assert [o.token_ids for o in outs] == [tokens for tokens, _ in refs[:3]]
    cached_before = llm.engine.scheduler.num_cached_tokens
    shared = [PROMPT[:17] + [11, 12], PROMPT + outs[0].token_ids[:5] + [40, 41]]
    got = _served(llm, shared)
    assert llm.engine.scheduler.num_cached_tokens - cached_before >= 16 + 24
    for out, prompt in zip(got, shared):
        tokens, logprobs = transformers_greedy_cached(oracle, prompt, MAX_TOKENS)
        assert out.token_ids == tokens
        assert max(abs(a - b) for a, b in zip(out.logprobs, logprobs)) <= 1e-3


def test_make_model_writes_deepseek32_only_in_the_mla_layout(tmp_path) -> None:
    preset = get_preset("tiny-v32")
    opts = MakeModelOptions(preset, "f32", "legacy")
    with pytest.raises(HybridError, match="--layout mla"):
        make_model(opts, get_vocab("small", preset.vocab_size), tmp_path / "x.gguf")


def test_routing_profiled_tuned_and_the_hot_experts_keep_the_tokens(models, tmp_path) -> None:
    """`hybrid profile` counts V3.2's routing; `hybrid tune` writes every MoE layer's hot
    experts into the bundled DeepSeek-V3.2 rules (the GPU mapped onto the CPU), the indexer
    still placed with its attention; in exact mode the tuned rules serve the bundled rules'
    tokens (the same layout and bf16 cache, every routed expert on the CPU)."""
    from cli.main import main
    from hybrid.engine.llm import LLM
    from hybrid.rules.planner import with_experts_mode
    from hybrid.tuning.profile import RoutingProfile

    path = str(models.path("tiny-v32", "q4_k_m", "mla"))
    preset = get_preset("tiny-v32")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the history of Rome"}\n{"prompt": "a poem about the sea"}\n')
    profile = tmp_path / "profile.json"
    assert main(["profile", "--gguf-path", path, "--prompts", str(prompts), "--max-tokens", "5",
                 "--out", str(profile)]) == 0
    recorded = RoutingProfile.load(profile)
    moe_layers = tuple(range(preset.first_k_dense, preset.num_layers))
    assert recorded.layers == moe_layers and recorded.decode_tokens == 2 * (5 - 1)
    assert (recorded.decode.sum(1) == preset.num_experts_per_tok * recorded.decode_tokens).all()
    out = tmp_path / "tuned.yaml"
    assert main(["tune", "--gguf-path", path, "--optimize-rules", "DeepSeek-V3.2", "--profile",
                 str(profile), "--gpu-memory", "2GiB", "--cache-lens", "1024", "--device-map",
                 "cuda=cpu", "--no-plots", "--out", str(out)]) == 0
    tuned = plan_model(path, str(out), check_devices=False, announce=False).plan
    held = {n: p.options["gpu_experts"] for n, p in tuned.placements.items()
            if n.endswith("mlp.experts")}
    assert len(held) == len(moe_layers) and all(held.values())
    assert all(p.device == tuned.placements[n.rsplit(".", 1)[0]].device
               for n, p in tuned.placements.items() if n.endswith("self_attn.indexer"))
    exact = with_experts_mode(str(out), "exact", tmp_path)
    (tmp_path / "bundled").mkdir()
    bundled = with_experts_mode("DeepSeek-V3.2", "exact", tmp_path / "bundled")
    got, want = (_served(LLM(path, str(rules), device_map={"cuda": "cpu"}), SERVED[:2])
                 for rules in (exact, bundled))
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-3
