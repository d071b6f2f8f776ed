"""MoEPool: submit/wait equals the synchronous moe_forward; NUMA groups (simulated) change nothing
beyond float rounding; errors reach wait(); topology and slicing helpers."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.formats.reference import rel_error
from cpu_kernels.moe import moe_forward
from cpu_kernels.runtime.placement import slice_align, split_rows
from cpu_kernels.runtime.pool import MoEPool
from cpu_kernels.runtime.topology import parse_cpulist, plan_groups

# (gate/up, down, H, I): packed in fast mode; no packed layout (blocks with row ranges); 32-blocks
MIXES = [(qt.Q4_K, qt.Q6_K, 512, 768), (qt.Q5_K, qt.Q3_K, 256, 512), (qt.Q5_0, qt.Q8_0, 96, 352)]
FAST_TOL = 1e-2


def _call(rng: np.random.Generator, num_tokens: int, top_k: int, num_experts: int, hidden: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.standard_normal((num_tokens, hidden)).astype(np.float32)
    ids = np.stack([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)])
    return x, ids, rng.random(ids.shape).astype(np.float32)


def _sync(x, ids, weights, experts, mode: str) -> np.ndarray:
    out = np.empty_like(x)
    moe_forward(x, ids, weights, experts, out, mode=mode)
    return out


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_submit_wait_equals_moe_forward_with_jobs_in_flight(mode: str) -> None:
    rng = np.random.default_rng(1)
    experts = random_experts(rng, 6, 512, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K)
    calls = [_call(rng, t, k, 6, 512) for t, k in [(1, 4), (3, 2), (37, 6), (5, 1)]]
    with MoEPool(threads=2) as pool:
        placed = pool.place(experts, mode)
        outs = [np.full_like(c[0], np.nan) for c in calls]
        jobs = [pool.submit(*c, placed, out) for c, out in zip(calls, outs)]  # all in flight
        for job, c, out in reversed(list(zip(jobs, calls, outs))):
            assert job.wait() is out
            np.testing.assert_array_equal(out, _sync(*c, experts, mode))
        assert all(job.done() for job in jobs)


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_run_inline_equals_moe_forward(mode: str) -> None:
    """The engine's path: the caller's thread drives the kernels, same results, same stamps."""
    rng = np.random.default_rng(4)
    experts = random_experts(rng, 6, 512, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K)
    with MoEPool(threads=2) as pool:
        assert pool.can_run_inline
        placed = pool.place(experts, mode)
        for t, k in [(1, 4), (9, 6)]:
            c = _call(rng, t, k, 6, 512)
            out, stamps = np.full_like(c[0], np.nan), np.zeros(2, np.int64)
            assert pool.run_inline(*c, placed, out, stamps) is out
            np.testing.assert_array_equal(out, _sync(*c, experts, mode))
            assert stamps[1] >= stamps[0] > 0
    with MoEPool(threads=2, numa_nodes=2) as pool:
        assert not pool.can_run_inline
        with pytest.raises(ValueError, match="one unpinned group"):
            pool.run_inline(*c, pool.place(experts, mode), out)


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: f"{qt.type_name(m[0])}-{qt.type_name(m[1])}")
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_two_simulated_numa_nodes_equal_one(mix: tuple[int, int, int, int], mode: str) -> None:
    gate_type, down_type, hidden, inter = mix
    rng = np.random.default_rng(inter)
    experts = random_experts(rng, 8, hidden, inter, gate_type, gate_type, down_type)
    with MoEPool(threads=2, numa_nodes=2) as pool:
        assert [g.num_threads for g in pool.groups] == [1, 1]
        placed = pool.place(experts, mode)
        bounds = [(s.i_lo, s.i_hi) for s in placed.slices]
        assert len(bounds) == 2 and bounds[0][0] == 0 and bounds[-1][1] == inter
        packs = mode == "fast" and gate_type != qt.Q5_K
        assert all((s.packed is not None) == packs for s in placed.slices)
        for num_tokens, top_k in [(1, 8), (19, 3), (64, 4)]:  # 64 x 4: AMX where the CPU has it
            x, ids, weights = _call(rng, num_tokens, top_k, 8, hidden)
            out = pool.submit(x, ids, weights, placed, np.full_like(x, np.nan)).wait()
            # slices sum in another order: exact equal up to float32 rounding, fast as well
            # (h is quantized per 32-group or rounded to bf16, and slices fall on 32-groups)
            err = rel_error(out, _sync(x, ids, weights, experts, mode).astype(np.float64))
            assert err <= 1e-6, f"{mode} T={num_tokens}: {err:.2e}"


def test_errors_reach_wait_and_the_pool_keeps_working(monkeypatch) -> None:
    import cpu_kernels.runtime.pool as pool_module

    rng = np.random.default_rng(2)
    experts = random_experts(rng, 4, 64, 32, qt.Q8_0, qt.Q8_0, qt.Q8_0)
    x, ids, weights = _call(rng, 2, 2, 4, 64)
    with MoEPool(threads=1) as pool:
        placed = pool.place(experts)
        with pytest.raises(ValueError, match="expert ids outside"):
            pool.submit(x, ids + 4, weights, placed, np.empty_like(x))  # checked at submit

        def broken(*args, **kwargs):
            raise RuntimeError("kernel failed")
        monkeypatch.setattr(pool_module, "run_moe", broken)
        job = pool.submit(x, ids, weights, placed, np.empty_like(x))
        with pytest.raises(RuntimeError, match="kernel failed"):
            job.wait(timeout=60)
        monkeypatch.undo()
        out = pool.submit(x, ids, weights, placed, np.empty_like(x)).wait(timeout=60)
        np.testing.assert_array_equal(out, _sync(x, ids, weights, experts, "exact"))


def test_topology_and_slices() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert plan_groups(3, numa_nodes=1)[0].num_threads == 3
    assert plan_groups(None, numa_nodes=1)[0].num_threads >= 1
    groups = plan_groups(2, numa_nodes=2)  # two CPUs here at least: simulated or real nodes
    assert [g.num_threads for g in groups] == [1, 1]
    assert set(groups[0].cpus).isdisjoint(groups[1].cpus)
    with pytest.raises(ValueError, match="cannot serve"):
        plan_groups(1, numa_nodes=2)
    experts = random_experts(np.random.default_rng(0), 1, 256, 704, qt.Q4_K, qt.Q4_K, qt.Q8_0)
    assert slice_align(experts) == 32
    assert split_rows(704, 2, 32) == [(0, 352), (352, 704)]
    assert split_rows(512, 3, 256) == [(0, 256), (256, 512)]  # fewer slices, none empty
