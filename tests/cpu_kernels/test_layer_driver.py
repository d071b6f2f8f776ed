"""drive_layers against moe_forward, with a second thread in the GPU's place: it writes each
layer's inputs, raises the ready flag and waits for the done flag before the next layer, as the
decode step's CUDA graph does through mapped pinned memory; one layer's SwiGLU clamped. Both
drivers: one parallel region a step (region_driver.py, where numba's layer allows it) and
packed_moe_kernel a layer; each equals moe_forward bit for bit."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from cpu_kernels.fast.packed import pack
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.moe import moe_forward
from cpu_kernels.runtime.layer_driver import (
    drive_layers,
    of_tuples,
    one_region_safe,
    packed_layers,
)
from cpu_kernels.runtime.pool import MoEPool
from tests.cpu_kernels.fake_gpu import SECOND, FakeGpu

DRIVERS = [False, True] if one_region_safe() else [False]  # one_region


@pytest.fixture(scope="module")
def layers():
    rng = np.random.default_rng(3)
    pool = MoEPool(threads=2)
    # the last layer's SwiGLU clamped (DeepSeek-V4's): each layer its own limit
    experts = [random_experts(rng, 8, 256, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K),
               random_experts(rng, 8, 256, 256, qt.Q5_0, qt.Q5_0, qt.Q8_0),
               dataclasses.replace(random_experts(rng, 8, 256, 256, qt.Q8_0, qt.Q8_0, qt.Q8_0),
                                   swiglu_limit=0.5)]
    placed = [pool.place(e, mode="fast") for e in experts]
    # compile the driver first, every flag already up (as the engine's start-up does): a cold
    # compile inside a test step would outlast the other thread's wait
    t, h = 1, 256
    for one_region in DRIVERS:
        drive_layers(np.ones(3, np.int64), np.zeros(3, np.int64), 1, t,
                     np.zeros((t, h), np.float32), np.zeros((t, 2), np.int64),
                     np.zeros((t, 2), np.float32), np.zeros((t, h), np.float32),
                     packed_layers(placed), 10 * SECOND, one_region=one_region)
    yield experts, placed
    pool.close()


@pytest.mark.parametrize("one_region", DRIVERS)
@pytest.mark.parametrize("n", [1, 3, 8])
def test_two_steps_match_moe_forward(layers, n, one_region):
    experts, placed = layers
    rng = np.random.default_rng(n)
    t, h, k = 8, 256, 2
    x, out = np.zeros((t, h), np.float32), np.zeros((t, h), np.float32)
    ids, w = np.zeros((t, k), np.int64), np.zeros((t, k), np.float32)
    ready, done = np.zeros(3, np.int64), np.zeros(3, np.int64)
    for seq in (1, 2):
        inputs = [(rng.standard_normal((n, h)).astype(np.float32),
                   np.stack([rng.choice(8, k, replace=False) for _ in range(n)]),
                   rng.random((n, k)).astype(np.float32)) for _ in experts]
        gpu = FakeGpu((x, ids, w, out), ready, done)
        gpu.start(seq, inputs)
        assert drive_layers(ready, done, seq, n, x, ids, w, out, packed_layers(placed),
                            10 * SECOND, one_region=one_region) == 3
        got = gpu.join()
        for e, (xi, ii, wi), g in zip(experts, inputs, got, strict=True):
            want = np.empty_like(xi)
            moe_forward(xi, ii, wi, e, want, mode="fast")
            np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("one_region", DRIVERS)
def test_timeout_reports_the_waiting_layer(layers, one_region):
    _, placed = layers
    x, out = np.zeros((1, 256), np.float32), np.zeros((1, 256), np.float32)
    ids, w = np.zeros((1, 2), np.int64), np.ones((1, 2), np.float32)
    ready, done = np.array([5, 0, 0], np.int64), np.zeros(3, np.int64)
    assert drive_layers(ready, done, 5, 1, x, ids, w, out, packed_layers(placed), 1000,
                        one_region=one_region) == 1
    assert done.tolist() == [5, 0, 0]


def test_layers_of_other_widths_take_the_layer_loop():
    """One parallel region's buffers are sized once for the step: layers whose widths differ
    have no table and run packed_moe_kernel a layer."""
    rng = np.random.default_rng(4)
    tuples = []
    for inter in (256, 512):
        pk = pack(random_experts(rng, 4, 256, inter, qt.Q8_0, qt.Q8_0, qt.Q8_0)).packed
        tuples.append((pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype,
                       pk.down.data, math.inf))
    assert of_tuples(tuple(tuples)).table is None
    assert of_tuples(tuple(tuples[:1]) * 2).table is not None


def test_needs_packed_layers(layers):
    experts, _ = layers
    pool = MoEPool(threads=1)
    with pytest.raises(ValueError, match="fast-mode"):
        packed_layers([pool.place(experts[0], mode="exact")])
    pool.close()


def test_python_entries_take_numba_fast_dispatch(layers, monkeypatch):
    """The kernels take their tile set as a numba type; a literal argument would make every
    call from Python type the whole kernel again (~30 ms, 10x a decode layer). The entries from
    Python (drive_layers, moe_forward's packed_moe) must dispatch without typing once compiled:
    here any typing raises."""
    from cpu_kernels.fast import packed_moe
    from cpu_kernels.runtime import layer_driver

    experts, placed = layers
    x, out = np.zeros((1, 256), np.float32), np.zeros((1, 256), np.float32)
    ids, w = np.zeros((1, 2), np.int64), np.ones((1, 2), np.float32)
    moe_forward(x, ids, w, experts[0], out, mode="fast")  # compiled (the fixture compiled drive)

    def typed_again(*args, **kwargs):
        raise AssertionError("a Python entry typed its kernel again")
    for entry in (layer_driver._drive, layer_driver.drive_in_one_region,
                  packed_moe.packed_moe_kernel):
        monkeypatch.setattr(entry, "_compile_for_args", typed_again)
    ready, done = np.ones(3, np.int64), np.zeros(3, np.int64)
    for one_region in DRIVERS:
        ready, done = np.ones(3, np.int64), np.zeros(3, np.int64)
        assert drive_layers(ready, done, 1, 1, x, ids, w, out, packed_layers(placed), SECOND,
                            one_region=one_region) == 3
    moe_forward(x, ids, w, experts[0], out, mode="fast")


def test_each_tile_family_runs_its_own_tiles_on_read_only_experts():
    """Memory-mapped packed experts (the disk cache's, read-only) of a K-quant layer and then of
    an IQ1_S one, in one process: each equals the reference. With the family a literal int, the
    i-quant call ran the K-quant tiles compiled first and returned NaN."""
    from cpu_kernels.fast.packed_moe import packed_moe
    from cpu_kernels.fast.tile_set import ALL_TILES, KQUANT_TILES, tile_family
    from cpu_kernels.formats.reference import moe_forward_ref, rel_error

    rng = np.random.default_rng(5)
    for types, family in (((qt.Q2_K, qt.Q2_K, qt.Q3_K), KQUANT_TILES),
                          ((qt.IQ1_S, qt.IQ1_S, qt.IQ2_XXS), ALL_TILES)):
        experts = random_experts(rng, 8, 256, 256, *types)
        assert tile_family(*types) is family
        pk = pack(experts).packed
        mats = [m.data.copy() for m in (pk.gate, pk.up, pk.down)]
        for m in mats:
            m.flags.writeable = False
        x = rng.standard_normal((3, 256)).astype(np.float32)
        ids = np.stack([rng.choice(8, 2, replace=False) for _ in range(3)])
        w = rng.random((3, 2)).astype(np.float32)
        out = np.zeros_like(x)
        packed_moe(types[0], mats[0], types[1], mats[1], types[2], mats[2], x, ids, w,
                   math.inf, out, np.zeros(2, np.int64), 2)
        want = moe_forward_ref(x, ids, w, experts)
        assert rel_error(out, want) <= 1e-2, types  # test_moe's FAST_TOL


@pytest.mark.skipif(not one_region_safe(), reason="the one-region driver needs numba's omp layer")
def test_a_region_short_of_threads_answers_not_together(layers):
    """More workers than numba's team: some would queue behind others on one thread and the
    first barrier would never open. The driver answers NOT_TOGETHER before touching a flag."""
    import numba

    from cpu_kernels.runtime.region_driver import NOT_TOGETHER, drive_in_one_region

    _, placed = layers
    packed = packed_layers(placed)
    x, out = np.zeros((1, 256), np.float32), np.zeros((1, 256), np.float32)
    ids, w = np.zeros((1, 2), np.int64), np.ones((1, 2), np.float32)
    ready, done = np.ones(3, np.int64), np.zeros(3, np.int64)
    got = drive_in_one_region(packed.tiles, ready, done, 1, 1, x, ids, w, out, *packed.table,
                              np.zeros(3, np.int64), 0, numba.get_num_threads() + 1, SECOND,
                              np.zeros((3, 2), np.int64),
                              np.zeros(numba.get_num_threads() + 2, np.int64),
                              SECOND // 100)
    assert got == NOT_TOGETHER
    assert done.tolist() == [0, 0, 0] and not out.any()
