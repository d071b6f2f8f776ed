"""A decode step captured whole, run without a GPU: DecoderProgram.run_on_device (every operator
on gpu_kernels in Triton's interpreter, the hand-over flags included) in this thread while
HostExperts answers the flags from another, as it does beside a replaying CUDA graph. Its
logits equal the step run piece by piece (DecoderProgram.run), for the one-call numba driver
(fast experts: one parallel region a step, and the layer loop it falls back to when numba's
team is short of its workers) and the Python loop (exact experts), with expert deferral too
(the host computes a layer's deferred experts while the device runs on), also beside GPU-held
experts (`gpu_experts`: their slots reach the host as -1, never deferred), in device memory or
in host memory (copied into the staging buffer inside the step). The hand-overs take the
fused launches (the router writes the rows and raises the flag; the next norm waits for the
answer and reads it) wherever no GPU-held expert changes what the host gets. The step's greedy
picks (the graph's last kernel) are the logits' argmax, read by the host after their flag."""

from __future__ import annotations

import threading

import pytest
import torch

from cpu_kernels.runtime.layer_driver import one_region_safe
from hybrid.engine.config import EngineConfig
from hybrid.engine.graphs.device_picks import DevicePicks
from hybrid.engine.llm import LLM
from hybrid.engine.step.forward_batch import ForwardBatch
from hybrid.engine.step.host_experts import HostExperts
from hybrid.engine.step.step_state import StepState
from hybrid.rules.planner import with_deferral, with_experts_mode, with_gpu_experts

pytestmark = pytest.mark.usefixtures("wide_tiles")  # see conftest.WIDE_TILES


@pytest.mark.skipif(torch.cuda.is_available(), reason="scripts/device_rules_check.py on GPUs")
@pytest.mark.parametrize("mode,one_call,short,defer,held", [
    ("fast", True, False, 0, False), ("fast", True, True, 0, False),
    ("exact", False, False, 0, False), ("fast", True, False, 1, False),
    ("fast", True, True, 2, False), ("exact", False, False, 1, False),
    ("fast", True, False, 2, "device"), ("exact", False, False, 1, "device"),
    ("fast", True, False, 2, "host")])
def test_whole_step_equals_pieces(models, mode, one_call, short, defer, held, tmp_path,
                                  monkeypatch):
    monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    path = str(models.path("tiny-v3", "q4_k_m", "legacy"))
    rules = with_deferral(str(with_experts_mode("DeepSeek-V3", mode, tmp_path)), defer, tmp_path)
    if held:  # half of tiny-v3's 16 routed experts on the (mapped) GPU, its memory or the host's
        rules = with_gpu_experts(str(rules), list(range(0, 16, 2)), held, tmp_path, "cuda")
    llm = LLM(path, str(rules), device_map={"cuda": "cpu"},
              engine_config=EngineConfig(max_batch_size=2, cache_lens=256, page_size=16))
    runner = llm.engine.runner
    assert all((op.gpu_experts is not None) == bool(held) and op.defer_experts == defer
               for op in runner.program.moe_layers)
    if held == "host":  # copied to the staging buffer by each step (2 rows hand them 4 pairs)
        assert all(op.gpu_experts.layout is not None for op in runner.program.moe_layers)
        assert all(op.hand_off(torch.zeros(2, op.top_k, dtype=torch.long),
                               torch.ones(2, op.top_k))[1] is not None
                   for op in runner.program.moe_layers)
    program, bridge = runner.program, runner.bridge
    # two decodes of different lengths, their cache rows written by a prefill first
    prompts = ([3, 14, 15, 92, 65], [35, 89])
    for i, p in enumerate(prompts):
        program.run(StepState(_batch(runner, [(p, [i], 0, True)]), num_real=len(p)))
    decodes = [([7], [i], len(p), True) for i, p in enumerate(prompts)]
    want = program.run(StepState(_batch(runner, decodes), num_real=2)).clone()

    bridge.use_flags(len(program.moe_layers))
    if short:  # one worker more than numba's team runs: the region's workers cannot all meet
        import numba

        from cpu_kernels.runtime import layer_driver
        team = numba.get_num_threads()
        monkeypatch.setattr(layer_driver.numba, "get_num_threads", lambda: team + 1)
    host = HostExperts(program.moe_layers, bridge)
    assert host.one_call == one_call
    host.warm_up()  # flags of its own: the bridge's stay as they were
    if one_call:  # a first start's background compile of the driver: the very signature
        from cpu_kernels.runtime.layer_driver import _drive, drive_in_one_region
        from cpu_kernels.runtime.precompile import compile_driver

        def signatures():
            return set(_drive.signatures), set(drive_in_one_region.signatures)
        compiled = signatures()
        op = program.moe_layers[0]
        pk = op.placed.slices[0].packed
        compile_driver((pk.gate.qtype, pk.up.qtype, pk.down.qtype), op.pool.tiles.qtypes,
                       len(program.moe_layers))
        assert signatures() == compiled
    if short and one_region_safe():
        assert host._one_region is False  # the warm-up found the team short
        assert "a parallel kernel a layer" in host.describe()
    elif one_call and one_region_safe():
        assert "one parallel region" in host.describe()
    assert bridge.ready.tolist() == bridge.done.tolist() == [0] * len(program.moe_layers)
    # the router's launch sends the rows and raises the flag (not with held experts, whose
    # slots the host gets as -1: copies, then the flag)
    picks = DevicePicks(2, runner.carried_ids, bridge)  # the graph's last kernel
    sends = []
    send = bridge.send
    monkeypatch.setattr(bridge, "send", lambda *a: (sends.append(1), send(*a)))
    for step in range(2):  # a second step: flags left from the first never pass for it
        # as WholeStepGraphs replays it: the number staged on the host, loaded by the step
        seq = bridge.stage_seq()
        errors: list[BaseException] = []

        def answer(seq=seq, errors=errors, prepared=step == 0):
            try:
                if prepared:  # as WholeStepGraphs.drive does before its beside thread
                    host.prepare(seq, 2)
                host.run(seq, 2)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        thread = threading.Thread(target=answer)
        thread.start()
        bridge.load_seq()
        got = program.run_on_device(StepState(_batch(runner, decodes), num_real=2))
        thread.join()
        assert not errors and int(bridge.error[0]) == 0
        assert bridge.done.tolist() == [seq] * len(program.moe_layers)
        host.wait_driving()  # the region (where one ran) started after prepare: at once
        if one_call and host._one_region is not False and one_region_safe():
            assert host.starts[1] >= host._prepared_at  # its first worker's stamp
        if one_call:  # each layer's experts after its flag, each layer after the last
            timeline = host.timeline()
            assert len(timeline) == len(program.moe_layers)
            assert timeline[0][0] == 0 and all(w >= 0 and b > 0 for w, b in timeline)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        picks.pick(got)  # the greedy tokens the next step reads, and the host with them
        picked = picks.of_step(seq, [1, 0]).result()
        ids = want.argmax(-1).tolist()
        assert [p.token_id for p in picked] == ids[::-1] == runner.carried_ids[:2].tolist()[::-1]
        logprobs = torch.log_softmax(want.double(), -1)
        assert [p.logprob for p in picked] == pytest.approx(
            [float(logprobs[r, ids[r]]) for r in (1, 0)], abs=1e-5)
    assert len(sends) == (2 * len(program.moe_layers) if held else 0)


def _batch(runner, chunks) -> ForwardBatch:
    fb = ForwardBatch.build(chunks, runner.page_size, runner.cache, runner.device)
    runner.attention.prepare(fb)  # as the runner's eager steps do
    return fb
