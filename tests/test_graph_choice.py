"""Start-up's choice between the two forms of decode graphs: the faster by median step time,
said in one line; `auto` is the default and a CPU run captures nothing to choose from."""

from __future__ import annotations

import pytest

from hybrid.engine.config import EngineConfig
from hybrid.engine.graphs.choice import describe, faster
from hybrid.errors import HybridError


def test_the_lower_median_wins() -> None:
    # one slow outlier round does not decide it
    assert faster({"step": [0.0146, 0.0145, 0.090, 0.0147, 0.0146],
                   "layers": [0.0169, 0.0170, 0.0168, 0.0171, 0.0169]}) == "step"
    assert faster({"step": [0.018, 0.017, 0.018], "layers": [0.016, 0.0165, 0.030]}) == "layers"


def test_a_tie_keeps_whole_steps() -> None:
    assert faster({"step": [0.015, 0.015], "layers": [0.015, 0.015]}) == "step"


def test_the_choice_is_said_with_both_times() -> None:
    line = describe({"step": [0.01459], "layers": [0.01690]}, "step")
    assert line == ("decode graphs: a whole step as one graph 14.59 ms a step, layer by layer "
                    "16.90 ms: whole steps (--decode-graph sets it)")
    assert describe({"step": [0.018], "layers": [0.016]}, "layers").endswith(
        ": layers (--decode-graph sets it)")


def test_auto_is_the_default_and_names_are_checked() -> None:
    assert EngineConfig().decode_graph == "auto"
    for form in ("auto", "step", "layers"):
        assert EngineConfig(decode_graph=form).decode_graph == form
    with pytest.raises(HybridError, match="decode_graph must be one of auto, step, layers"):
        EngineConfig(decode_graph="graph")


def test_a_cpu_engine_captures_no_graphs(models) -> None:
    from hybrid.engine.llm import LLM

    llm = LLM(str(models.path("tiny-v3", "q4_k_m")), "cpu",
              engine_config=EngineConfig(max_batch_size=2, cache_lens=256, page_size=16))
    assert llm.engine.runner.graphs is None and llm.engine.runner.decode_graph is None


def test_a_timing_that_fails_keeps_whole_steps_but_a_lost_device_stops(monkeypatch,
                                                                        caplog) -> None:
    """The timing needs CUDA graphs (the GPU machine runs it: scripts/device_rules_check.py);
    here only what start-up does when it raises."""
    from types import SimpleNamespace

    from hybrid.engine.graphs import choice as graph_choice
    from hybrid.engine.graphs import setup as graphs_setup
    from hybrid.errors import DeviceLost

    runner = SimpleNamespace(program=SimpleNamespace(moe_layers=[object()]), device="cuda:0")

    def fails(error):
        def measure(capture, device):
            raise error
        return measure

    monkeypatch.setattr(graph_choice, "measure", fails(RuntimeError("capture went wrong")))
    with caplog.at_level("WARNING", logger="hybrid.engine"):
        assert graphs_setup.measure(runner, None) == ("step", None)
    assert "timing the decode graphs failed (RuntimeError: capture went wrong)" in caplog.text
    monkeypatch.setattr(graph_choice, "measure", fails(DeviceLost("gone")))
    with pytest.raises(DeviceLost):
        graphs_setup.measure(runner, None)
    runner.program.moe_layers = []  # no CPU experts: nothing to time
    assert graphs_setup.measure(runner, None) == ("step", None)
