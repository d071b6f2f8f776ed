"""The background compile of a first start (cpu_kernels/runtime/precompile.py): it compiles the very
signature the engine's experts call (else the engine compiles again after waiting), and the
loader starts it for the plan's fast-mode CPU expert types only; the same for the load-time
packers, started before the plan."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels.formats import qtypes as qt
from cpu_kernels.runtime.precompile import (
    BackgroundCompile,
    BackgroundPackers,
    compile_kernels,
    compile_packer,
    token_counts,
)
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.ops.compile_ahead import compile_ahead
from hybrid.rules.planner import plan_model


def test_the_background_call_types_as_the_engine_calls(models) -> None:
    """After the engine ran its fast-mode experts, the background call adds no compiled
    signature to the kernel: the same argument types, so the cache it writes is the one the
    engine reads."""
    from cpu_kernels.fast.packed_moe import packed_moe_kernel

    llm = LLM(str(models.path("tiny-v3", "q4_k_m", "legacy")), "DeepSeek-V3.yaml",
              device_map={"cuda": "cpu"})
    llm.generate(prompt_token_ids=[[3, 4, 5]], sampling_params=SamplingParams(max_tokens=2))
    engine_signatures = set(packed_moe_kernel.signatures)
    assert engine_signatures
    compile_kernels((qt.Q4_K, qt.Q4_K, qt.Q6_K), 1, (qt.Q4_K, qt.Q6_K))
    assert set(packed_moe_kernel.signatures) == engine_signatures


def test_the_loader_starts_one_compile_on_the_files_tile_set(models, monkeypatch) -> None:
    """One job for all layers, on the set of every type among them: the set the engine's pool
    passes (MoEPool.tiles)."""
    started = []
    monkeypatch.setattr(BackgroundCompile, "start", classmethod(
        lambda cls, types, tiles=None, drive_layers=0, cores=None:
        started.append((types, tiles, drive_layers)) or "job"))
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    fast = plan_model(path, "DeepSeek-V3.yaml", device_map={"cuda": "cpu"}, announce=False)
    assert compile_ahead(fast.plan, fast.gguf, fast.spec) == ["job"]
    assert len(started) == 1
    types, tiles, drive_layers = started[0]
    assert types[0] == types[1] == qt.Q4_K and types[2] in tiles  # gate and up; down Q4_K/Q6_K
    assert tiles == (qt.Q4_K, qt.Q6_K)
    assert drive_layers == fast.spec.num_layers - fast.spec.first_k_dense  # every MoE layer
    started.clear()
    exact = plan_model(path, "cpu.yaml", announce=False)  # exact mode: no packed kernels
    assert compile_ahead(exact.plan, exact.gguf, exact.spec) == [] and started == []


@pytest.mark.parametrize("cores,types,expect", [
    (2, (qt.Q4_K, qt.Q4_K, qt.Q6_K), False),  # too few cores: loading needs them
    (16, (qt.Q4_K, qt.Q4_K, qt.Q5_K), False),  # Q5_K has no packed layout: nothing to compile
])
def test_no_background_compile_where_it_cannot_help(cores, types, expect) -> None:
    assert (BackgroundCompile.start(types, cores=cores) is not None) is expect


def test_a_background_process_compiles_and_exits(tmp_path, monkeypatch) -> None:
    """The real processes, with their own cache folder: they exit 0 and leave numba's cache
    files there."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    job = BackgroundCompile.start((qt.Q8_0, qt.Q8_0, qt.Q8_0), (qt.Q8_0,), 2, cores=8)
    # a process a token count, and the driver's beside them
    assert job is not None and len(job.procs) == len(token_counts(job.types)) + 1
    assert job.wait() == [0] * len(job.procs)
    assert any(p.suffix == ".nbc" for p in tmp_path.rglob("*"))
    assert np.all([p.returncode == 0 for p in job.procs])


def test_a_stopped_background_compile_leaves_no_process(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    job = BackgroundCompile.start((qt.Q4_K, qt.Q4_K, qt.Q6_K), cores=8)
    job.stop()
    assert all(p.poll() is not None for p in job.procs)
    assert job.wait() == [p.returncode for p in job.procs]


def test_a_failed_background_compile_is_logged_and_start_up_goes_on(caplog) -> None:
    """The engine's wait names a process that failed (the warm-up then compiles the kernels
    itself); a second wait returns at once."""
    from hybrid.engine.engine import _waiter

    job = BackgroundCompile((qt.Q4_K, qt.Q4_K, 999), (qt.Q4_K,), 0)  # no such type: exits 1
    said: list[str] = []
    wait = _waiter([job], said.append)
    with caplog.at_level("WARNING", logger="hybrid.engine"):
        wait()
    assert said == ["waiting for the CPU experts' kernels compiling in the background"]
    # a process a token count: one, or two where this CPU runs prompt steps on AMX
    exited = f"exited {[1] * len(job.procs)}"
    assert "background compile" in caplog.text and exited in caplog.text
    wait()
    assert len(said) == 1


def test_the_background_packer_types_as_the_loader_calls(models) -> None:
    """After the loader packed a fast-mode file's experts, the packer process's call adds no
    compiled signature to either type's packer."""
    from cpu_kernels.fast.pack_kernels import _kernel

    LLM(str(models.path("tiny-v3", "q4_k_m", "legacy")), "DeepSeek-V3.yaml",
        device_map={"cuda": "cpu"})
    for t in (qt.Q4_K, qt.Q6_K):
        loader = set(_kernel(t).signatures)
        assert loader
        compile_packer(t)
        assert set(_kernel(t).signatures) == loader


def test_the_loader_starts_the_packers_before_the_plan_and_keeps_them_for_fast_mode(
        models, monkeypatch) -> None:
    """Started for the file's packable expert types, waited for by the first pack; stopped
    where the plan packs nothing (exact mode)."""
    from hybrid.rules.load import load_with_rules

    events: list = []

    class Recorder:
        def __init__(self, types) -> None:
            events.append(("start", tuple(sorted(types))))

        def wait(self) -> None:
            events.append("wait")

        def stop(self) -> None:
            events.append("stop")

    monkeypatch.setattr(BackgroundPackers, "start", classmethod(lambda cls, types: Recorder(types)))
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    load_with_rules(path, "DeepSeek-V3.yaml", device_map={"cuda": "cpu"})
    assert events[0] == ("start", (qt.Q4_K, qt.Q6_K)) and "wait" in events
    assert "stop" not in events
    events.clear()
    load_with_rules(path, "cpu.yaml")
    assert events == [("start", (qt.Q4_K, qt.Q6_K)), "stop"]


def test_a_background_packer_compiles_and_exits(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert BackgroundPackers.start({qt.Q4_K, qt.Q5_K}, cores=2) is None  # too few cores
    job = BackgroundPackers.start({qt.Q8_0, qt.Q5_K}, cores=8)  # Q5_K: no packed layout
    assert job is not None and job.types == (qt.Q8_0,)
    assert job.wait() == [0]
    assert any(p.suffix == ".nbc" for p in tmp_path.rglob("*"))
