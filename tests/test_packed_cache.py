"""Fast mode's packed experts on disk: written on the first start, memory-mapped on the next,
rewritten when the file or the layout changes, skipped when the disk is short."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from cpu_kernels.fast.packed import PackedExperts
from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model import packed_cache
from hybrid.model.packed_cache import PackedCache
from hybrid.ops.experts import ExpertsOp
from hybrid.rules.planner import with_experts_mode

PROMPT = [0, 42, 574, 81, 2058, 3, 223, 804]


def _start(path: Path, rules: Path, cache: bool) -> tuple[LLM, list[int]]:
    llm = LLM(str(path), str(rules), engine_config=EngineConfig(packed_cache=cache))
    out = llm.generate(prompt_token_ids=[PROMPT],
                       sampling_params=SamplingParams(temperature=0, max_tokens=8,
                                                      ignore_eos=True))
    return llm, out[0].outputs[0].token_ids


def _packed(llm: LLM) -> list[PackedExperts]:
    return [m.cpu_weights.packed for m in llm.loaded.model.modules()
            if isinstance(m, ExpertsOp) and m.backend == "cpu"]


@pytest.fixture
def setup(models, tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    root = tmp_path / "packed"
    monkeypatch.setenv("HYBRID_PACKED_CACHE_DIR", str(root))
    model = tmp_path / "model.gguf"
    shutil.copy(models.path("tiny-v3", "q4_k_m"), model)
    return model, with_experts_mode("cpu", "fast", tmp_path), root


def test_second_start_maps_the_first_starts_copy(setup) -> None:
    model, rules, root = setup
    _, in_memory = _start(model, rules, cache=False)
    assert not root.exists()
    first, tokens = _start(model, rules, cache=True)
    files = sorted(root.glob("*/blk.*.npy"))
    layers = len(_packed(first))
    assert len(files) == 3 * layers and tokens == in_memory
    stamps = {f: f.stat().st_mtime_ns for f in files}
    second, again = _start(model, rules, cache=True)
    assert again == tokens
    assert {f: f.stat().st_mtime_ns for f in files} == stamps  # read, not rewritten
    for packed in _packed(second):  # the kernels read the memory maps themselves
        assert all(isinstance(m.data, np.memmap) for m in (packed.gate, packed.up, packed.down))


def test_a_changed_file_gets_its_own_entry(setup) -> None:
    model, rules, root = setup
    _start(model, rules, cache=True)
    os.utime(model, ns=(1, 1))  # same bytes, another mtime: another identity
    _start(model, rules, cache=True)
    assert len([d for d in root.iterdir() if d.is_dir()]) == 2


def test_a_damaged_or_foreign_file_is_replaced(setup) -> None:
    model, rules, root = setup
    _, tokens = _start(model, rules, cache=True)
    victim = min(root.glob("*/blk.*.gate.npy"))
    np.save(victim, np.zeros((1, 2, 3), np.uint8))
    _, again = _start(model, rules, cache=True)
    assert again == tokens and np.load(victim, mmap_mode="r").shape != (1, 2, 3)


def test_a_short_disk_packs_in_memory(setup, monkeypatch, caplog) -> None:
    model, rules, root = setup
    usage = shutil.disk_usage(model.parent)
    monkeypatch.setattr(packed_cache.shutil, "disk_usage",
                        lambda p: usage._replace(free=1 << 20))
    llm, _ = _start(model, rules, cache=True)
    assert not list(root.glob("*/blk.*.npy"))
    assert "packing in memory" in caplog.text
    assert all(not isinstance(p.gate.data, np.memmap) for p in _packed(llm))


def test_layout_version_is_part_of_the_key(models, monkeypatch) -> None:
    gguf = GGUFModelFile(models.path("tiny-v3", "q4_k_m"))
    before = PackedCache.for_model(gguf).folder
    monkeypatch.setattr(packed_cache, "LAYOUT_VERSION", packed_cache.LAYOUT_VERSION + 1)
    assert PackedCache.for_model(gguf).folder != before


def test_copied_weights_release_their_gguf_pages(models, monkeypatch) -> None:
    """A weight held as a copy (dequantized, or on a device) lets its GGUF pages go from the
    process; a `gguf`-format weight on the CPU is a view of the map and keeps them (exact
    mode's experts read their blocks)."""
    released: list[str] = []
    real = GGUFModelFile.release

    def spy(self, name: str) -> int:
        released.append(name)
        return real(self, name)

    monkeypatch.setattr(GGUFModelFile, "release", spy)
    path = models.path("tiny-v3", "q4_k_m")
    llm = LLM(str(path), "cpu.yaml")  # f32 copies of everything but the experts
    assert "token_embd.weight" in released and "blk.0.attn_kv_a_mqa.weight" in released
    assert not any("_exps." in n for n in released)  # exact experts read their blocks
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True))  # a re-read page just faults back in
    assert len(out[0].outputs[0].token_ids) == 6
