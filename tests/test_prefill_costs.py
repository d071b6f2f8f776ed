"""The per-layer choice between streamed and CPU experts (hybrid/engine/prefill/prefill_costs.py)."""

from __future__ import annotations

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.prefill.prefill_costs import ExpertPlacement, PrefillCosts, interpolate
from hybrid.errors import HybridError

# a V2-Lite-like layer: streaming costs its copy (7 ms) until the kernels pass it at ~2K tokens;
# the CPU takes ~0.1 ms a token
COSTS = PrefillCosts(400_000_000, stream_ms=((128, 7.0), (512, 7.2), (2048, 9.0)),
                     cpu_ms=((16, 2.0), (64, 6.5), (256, 25.0)))


def test_interpolate_flat_below_linear_between_proportional_beyond() -> None:
    pts = ((10, 1.0), (20, 3.0))
    assert interpolate(pts, 1) == 1.0
    assert interpolate(pts, 15) == pytest.approx(2.0)
    assert interpolate(pts, 40) == pytest.approx(6.0)


def test_crossover_where_streaming_starts_to_win() -> None:
    cross = COSTS.crossover()
    assert cross is not None and 64 < cross < 128
    stream, cpu = COSTS.costs(cross, COSTS.layer_nbytes)
    assert stream < cpu
    stream, cpu = COSTS.costs(cross - 1, COSTS.layer_nbytes)
    assert stream >= cpu
    never = PrefillCosts(1, stream_ms=((128, 100.0),), cpu_ms=((16, 1.0), (256, 10.0)))
    assert never.crossover() is None


def test_auto_streams_long_steps_per_layer_by_bytes() -> None:
    # layer 1 holds 4x the bytes (other types): both sides scale, so the same crossover
    p = ExpertPlacement("auto", (400_000_000, 1_600_000_000, 400_000_000), COSTS)
    assert p.streamed(1024, has_prompt=True) == (0, 1, 2)
    assert p.streamed(32, has_prompt=True) == ()
    assert p.streamed(1024, has_prompt=False) == ()  # decode-only steps keep their graphs


def test_modes_cpu_and_stream_and_unmeasured_auto() -> None:
    nbytes = (1, 1)
    assert ExpertPlacement("cpu", nbytes, COSTS).streamed(4096, True) == ()
    assert ExpertPlacement("stream", nbytes).streamed(2, True) == (0, 1)
    assert ExpertPlacement("stream", nbytes).streamed(2, False) == ()
    assert ExpertPlacement("auto", nbytes).streamed(4096, True) == ()  # nothing measured


def test_config_rejects_unknown_modes_and_memory() -> None:
    with pytest.raises(HybridError, match="prefill_experts must be one of auto, cpu, stream"):
        EngineConfig(prefill_experts="gpu")
    with pytest.raises(HybridError, match="stream_memory_gib must be positive"):
        EngineConfig(stream_memory_gib=0)


def test_stream_without_gpu_kernels_is_a_clear_error(models, monkeypatch) -> None:
    from hybrid.engine.llm import LLM

    monkeypatch.delenv("HYBRID_GPU_KERNELS_ON_CPU", raising=False)
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    config = EngineConfig(max_batch_size=2, chunk_size=8, cache_lens=256, page_size=16,
                          prefill_experts="stream")
    with pytest.raises(HybridError, match="--prefill-experts stream: the model runs on cpu, "
                                          "not a CUDA device; use --prefill-experts auto or cpu"):
        LLM(path, "cpu", engine_config=config)
    # auto on a CPU-only machine: nothing streams, nothing is measured
    llm = LLM(path, "cpu", engine_config=EngineConfig(max_batch_size=2, chunk_size=8,
                                                      cache_lens=256, page_size=16))
    assert llm.engine.runner.stream is None
    assert llm.engine.runner.placement.streamed(4096, True) == ()
