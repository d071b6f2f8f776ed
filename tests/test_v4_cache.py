"""DeepSeek-V4's caches as `rules explain` counts them (hybrid/model/v4_cache.py): equal to what
transformers' V4 cache layers hold after prompts and decode steps, and the plan of a full-size
V4 Q4_K_M file against the file's own tensors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hybrid.model import v4_cache
from hybrid.synth.presets_v4 import TINY_V4, V4

from .test_deepseek4 import V4_CPU_EXPERTS


def _held_floats(cache) -> list[int]:
    """Floats each layer of a transformers DeepseekV4 cache holds: the window's keys (its plain
    window layers keep the same rows again as values: not counted) and every compressor
    state."""
    out = []
    for layer in cache.layers:
        n = layer.keys.numel() if getattr(layer, "keys", None) is not None else 0
        for states in ("buffer_kv", "buffer_gate", "compressed_kv", "overlap_kv",
                       "overlap_gate"):
            n += sum(t.numel() for t in getattr(layer, states, {}).values() if t is not None)
        out.append(n)
    return out


@pytest.mark.parametrize("prompt,steps", [(1, 0), (5, 0), (37, 3), (130, 0), (129, 2),
                                          (300, 5)])
def test_rows_equal_transformers_caches(prompt: int, steps: int) -> None:
    """A prompt then decode steps: before and past the window (16), a CSA window (4), an HCA
    window (128), with open windows left over."""
    from transformers import DeepseekV4ForCausalLM

    torch.manual_seed(0)
    config = TINY_V4.to_hf_config()
    model = DeepseekV4ForCausalLM(config).eval()
    with torch.inference_mode():
        cache = model(input_ids=torch.randint(0, config.vocab_size, (1, prompt)),
                      use_cache=True).past_key_values
        for _ in range(steps):
            model(input_ids=torch.randint(0, config.vocab_size, (1, 1)), cache=cache,
                  use_cache=True)
    tokens = prompt + steps
    assert _held_floats(cache) == [v4_cache.layer_rows(TINY_V4, i, tokens)
                                   for i in range(TINY_V4.num_layers)]
    assert v4_cache.request_bytes(TINY_V4, tokens, 4) == 4 * sum(_held_floats(cache))


def test_a_long_context_costs_its_compressed_rows() -> None:
    # V4-Flash: 20 CSA layers of (512 + 128) / 4 floats a token, 23 HCA layers of 512 / 128
    ratios = V4.compress_ratios
    assert (ratios.count(4), ratios.count(128), ratios.count(0)) == (20, 23, 0)
    per_token = v4_cache.compressed_bytes_per_token(V4, 4)
    assert per_token == 4 * (20 * 640 / 4 + 23 * 4)
    grown = v4_cache.request_bytes(V4, 131072 + 1024, 4) - v4_cache.request_bytes(V4, 131072, 4)
    assert grown == 1024 * per_token  # whole windows of both ratios: exactly the rows


@pytest.mark.parametrize("tokens,entries", [(0, 8), (3, 8), (100, 1), (5000, 8), (40000, 32)])
def test_the_store_holds_at_most_store_bytes(tokens: int, entries: int) -> None:
    """However `tokens` fall between at most `entries` caches (the prefix store's bounds),
    their rows stay within store_rows; one cache of them all is within a window's slack."""
    import random

    rng = random.Random(tokens)
    for _ in range(50):
        cuts = sorted(rng.randint(0, tokens) for _ in range(rng.randint(0, entries - 1)))
        parts = [b - a for a, b in zip([0, *cuts], [*cuts, tokens], strict=True)]
        for layer in range(TINY_V4.num_layers):
            bound = v4_cache.store_rows(TINY_V4, layer, tokens, entries)
            assert sum(v4_cache.layer_rows(TINY_V4, layer, t) for t in parts) <= bound
    one = v4_cache.request_bytes(TINY_V4, tokens, 4)
    assert one <= v4_cache.store_bytes(TINY_V4, tokens, 1, 4) <= one + 4 * sum(
        2 * 128 * (2 * TINY_V4.head_dim + 2 * TINY_V4.index_head_dim)
        for _ in range(TINY_V4.num_layers))


def _plan(path: str, tmp_path: Path, device: str, mode: str = "exact"):
    from hybrid.rules.planner import plan_model

    rules = tmp_path / f"v4-{device}.yaml"  # the routed experts on the CPU, the rest on device
    rules.write_text(V4_CPU_EXPERTS.replace("MODE", mode).replace(
        "{class: default, kwargs: {generate_device: cpu}}",
        f"{{class: default, kwargs: {{generate_device: {device}}}}}"))
    return plan_model(path, str(rules), announce=False, check_devices=False)


def test_explain_counts_the_v4_caches_of_one_request(models, tmp_path) -> None:
    from hybrid.rules.explain import explain, render_table

    planned = _plan(str(models.path("tiny-v4", "f32")), tmp_path, "cpu")
    exp = explain(planned.plan, planned.spec, 4096, 24 << 30, None)
    store = v4_cache.store_bytes(TINY_V4, 4096, v4_cache.store_entries(16), 4)
    assert exp.v4 and exp.prefix_store == {"cpu": store}
    assert exp.devices["cpu"].kv_cache == v4_cache.request_bytes(TINY_V4, 4096, 4) + store
    assert exp.kv_bytes_per_token == {"cpu": round(v4_cache.compressed_bytes_per_token(
        TINY_V4, 4))}
    assert exp.serve_cache_lens == {} and exp.fits
    text = render_table(exp, "V4")
    assert "for one request of 4,096 tokens: its compressed rows" in text
    assert "in the prefix cache's store of finished prompts' caches, 4,096 tokens" in text
    fewer = explain(planned.plan, planned.spec, 4096, 24 << 30, None, max_batch_size=2)
    assert fewer.prefix_store["cpu"] < store  # 8 entries, not 32: fewer windows


@pytest.fixture(scope="module")
def v4_sparse(tmp_path_factory) -> Path:
    """A full-size header-only DeepSeek-V4-Flash Q4_K_M (sparse: no weight bytes)."""
    from hybrid.synth.make_v4 import make_v4
    from hybrid.synth.vocab import get_vocab

    out = tmp_path_factory.mktemp("v4") / "DeepSeek-V4-Flash-Q4_K_M.gguf"
    return make_v4(V4, "q4_k_m", 0, get_vocab("deepseek", V4.vocab_size), out,
                   header_only=True)[0]


@pytest.mark.parametrize("cache_lens", [32768, 131072])
def test_full_v4_q4_k_m_with_transformers_attention_on_24_gib(v4_sparse: Path, tmp_path,
                                                              cache_lens: int) -> None:
    """Routed experts on the CPU kernels, the rest transformers' own modules on the GPU: those
    hold f32 (4 bytes a parameter, whatever the file's type), 27.2 GiB, so the plan does not fit
    24 GiB and explain says what to move. The caches: one request's window and compressed
    rows, in f32."""
    from hybrid.gguf.reader import GGUFModelFile
    from hybrid.rules.explain import explain

    assert v4_sparse.stat().st_blocks * 512 < 64 * 2**20  # headers only on disk
    infos = {n: e[0] for n, e in GGUFModelFile(str(v4_sparse)).tensor_infos.items()}
    planned = _plan(str(v4_sparse), tmp_path, "cuda", "exact")
    exp = explain(planned.plan, planned.spec, cache_lens, 24 << 30, 512 << 30)
    gpu, cpu = exp.devices["cuda:0"], exp.devices["cpu"]
    experts = {n for n in infos if "_exps." in n}
    on_gpu = {n for n in infos if n not in experts and "tid2eid" not in n}
    assert cpu.weights == sum(infos[n].nbytes for n in experts)  # exact: the file's blocks
    assert gpu.weights == 4 * sum(math.prod(infos[n].shape) for n in on_gpu)
    assert 27 * 2**30 < gpu.weights < 27.5 * 2**30
    assert gpu.kv_cache == v4_cache.request_bytes(V4, cache_lens, 4) + v4_cache.store_bytes(
        V4, cache_lens, v4_cache.store_entries(16), 4)
    assert not gpu.fits and not exp.fits
    assert any("self_attn.q_b_proj" in a for a in exp.advice)


@pytest.mark.parametrize("cache_lens", [32768, 131072])
def test_full_v4_q4_k_m_with_the_bundled_gpu_layout_fits_24_gib(v4_sparse: Path,
                                                                cache_lens: int) -> None:
    """The bundled DeepSeek-V4.yaml keeps every linear layer, the embedding and the head in the
    file's blocks on the GPU; what stays transformers' own (norms, hyper-connections, routers,
    compressors' small parts) holds f32. With one request's caches it fits a 24 GiB GPU."""
    from hybrid.gguf.reader import GGUFModelFile
    from hybrid.rules.explain import explain
    from hybrid.rules.planner import plan_model

    infos = {n: e[0] for n, e in GGUFModelFile(str(v4_sparse)).tensor_infos.items()}
    planned = plan_model(str(v4_sparse), "DeepSeek-V4", announce=False, check_devices=False)
    ops = {p.path: p.operator for p in planned.plan.placements.values()}
    assert ops["model.layers.2.self_attn.o_a_proj"] == "grouped_linear"
    exp = explain(planned.plan, planned.spec, cache_lens, 24 << 30, 512 << 30)
    gpu, cpu = exp.devices["cuda:0"], exp.devices["cpu"]
    assert cpu.weights > 150 * 2**30  # the routed experts (fast mode's packed copy)
    blocks = {n for n in infos if n.endswith(".weight") and infos[n].qtype not in (0, 26)
              and "_exps." not in n}  # quantized: what the operators keep as the file has it
    floats = {n for n in infos if n not in blocks and "_exps." not in n and "tid2eid" not in n}
    assert gpu.weights == sum(infos[n].nbytes for n in blocks) + 4 * sum(
        math.prod(infos[n].shape) for n in floats)
    assert 4 * 2**30 < gpu.weights < 4.5 * 2**30
    assert gpu.kv_cache == v4_cache.request_bytes(V4, cache_lens, 4) + v4_cache.store_bytes(
        V4, cache_lens, v4_cache.store_entries(16), 4)
    assert gpu.fits
