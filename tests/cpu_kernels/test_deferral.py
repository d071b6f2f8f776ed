"""Expert deferral (cpu_kernels/runtime/deferral.py): the split against its plain reference,
and every driver of a step (the Python `Deferral`, the layer loop, the one parallel region)
against the protocol written out with moe_forward, bit for bit, with a second thread in the
GPU's place that writes the next layer's inputs as soon as a layer's done flag is up."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.moe import moe_forward
from cpu_kernels.runtime.deferral import (
    Deferral,
    deferred_ks,
    split_deferred,
    split_deferred_reference,
)
from cpu_kernels.runtime.handshake import set_flag, wait_equal
from cpu_kernels.runtime.layer_driver import drive_layers, one_region_safe, packed_layers
from cpu_kernels.runtime.pool import MoEPool
from tests.cpu_kernels.fake_gpu import SECOND, FakeGpu

DRIVERS = ["python", "layers"] + (["region"] if one_region_safe() else [])
H, E, K = 256, 8, 3


@pytest.mark.parametrize("seed", range(6))
def test_split_matches_reference(seed):
    rng = np.random.default_rng(seed)
    n, top_k = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    ids = rng.integers(-1, 16, (n, top_k)).astype(np.int64)
    # ties on purpose: weights from a few values
    w = rng.choice(np.array([0.1, 0.25, 0.25, 0.5], np.float32), (n, top_k))
    for k in range(top_k + 1):
        for rows in (0, n // 2, n):
            now, later = np.empty_like(ids), np.empty_like(ids)
            split_deferred(ids, w, k, rows, now, later)
            want_now, want_later = split_deferred_reference(ids, w, k, rows)
            np.testing.assert_array_equal(now, want_now)
            np.testing.assert_array_equal(later, want_later)
            # every valid slot in exactly one of the two
            np.testing.assert_array_equal(np.maximum(now, later), ids)


def test_split_defers_the_lowest_weights_of_decode_rows_only():
    ids = np.array([[4, 7, 1], [2, 3, 5]], np.int64)
    w = np.array([[0.5, 0.2, 0.3], [0.1, 0.1, 0.8]], np.float32)
    now, later = split_deferred_reference(ids, w, 1, 1)
    assert now.tolist() == [[4, -1, 1], [2, 3, 5]] and later.tolist() == [[-1, 7, -1]] + [[-1] * 3]
    now, later = split_deferred_reference(ids, w, 2, 2)
    assert later[1].tolist() == [2, 3, -1]  # a tie defers the later slot first; both go here


def test_last_layer_defers_nothing():
    assert deferred_ks([2, 2, 2]).tolist() == [2, 2, 0]
    with pytest.raises(ValueError, match="the last 0"):
        drive_layers(np.zeros(1, np.int64), np.zeros(1, np.int64), 1, 1, None, None, None, None,
                     packed_layers([]), 1, deferred=np.ones(1, np.int64))


def protocol(experts, inputs, ks, rows):
    """deferral.py's protocol written out: each layer's handed-back output."""
    outs, carry = [], None
    for e, (x, ids, w), k in zip(experts, inputs, ks):
        now, later = split_deferred_reference(ids, w, int(k), rows)
        out = np.empty_like(x)
        moe_forward(x, now, w, e, out, mode="fast")
        if carry is not None:
            out += carry
        outs.append(out)
        carry = None
        if k and rows:
            carry = np.empty_like(x)
            moe_forward(x, later, w, e, carry, mode="fast")
    return outs


@pytest.fixture(scope="module")
def layers():
    rng = np.random.default_rng(7)
    pool = MoEPool(threads=2)
    experts = [random_experts(rng, E, H, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K),
               random_experts(rng, E, H, 256, qt.Q8_0, qt.Q8_0, qt.Q8_0),
               random_experts(rng, E, H, 256, qt.Q4_K, qt.Q4_K, qt.Q8_0)]
    placed = [pool.place(e, mode="fast") for e in experts]
    for one_region in [False, True] if one_region_safe() else [False]:  # compiled up front
        drive_layers(np.ones(3, np.int64), np.zeros(3, np.int64), 1, 1,
                     np.zeros((1, H), np.float32), np.zeros((1, K), np.int64),
                     np.ones((1, K), np.float32), np.zeros((1, H), np.float32),
                     packed_layers(placed), 10 * SECOND, one_region=one_region,
                     deferred=np.array([1, 1, 0]), rows=1)
    for p in placed:  # the python driver's kernel call, compiled here: not against FakeGpu's wait
        pool.run_inline(np.zeros((1, H), np.float32), np.zeros((1, K), np.int64),
                        np.ones((1, K), np.float32), p, np.zeros((1, H), np.float32))
    yield experts, placed, pool
    pool.close()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("ks,n,rows", [([1, 1, 0], 1, 1), ([2, 0, 0], 4, 4), ([1, 2, 0], 5, 3),
                                       ([0, 0, 0], 3, 3), ([1, 1, 0], 3, 0)])
def test_every_driver_follows_the_protocol(layers, driver, ks, n, rows):
    _drive_and_compare(layers, driver, ks, n, rows, held=0.0)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("ks,n,rows,held", [([1, 1, 0], 1, 1, 1.0), ([2, 2, 0], 6, 6, 0.4),
                                            ([1, 2, 0], 5, 3, 0.6), ([2, 1, 0], 4, 4, 1.0)])
def test_every_driver_follows_the_protocol_beside_held_experts(layers, driver, ks, n, rows,
                                                              held):
    """Slots held on a GPU (`gpu_experts`) reach the host as -1: a row defers among its CPU
    experts only, fewer than k or none where it has fewer, and every driver agrees."""
    _drive_and_compare(layers, driver, ks, n, rows, held)


def _drive_and_compare(layers, driver, ks, n, rows, held):
    """Two steps of `driver` against `protocol`, bit for bit; `held`: the share of slots given
    as -1 (held elsewhere), the first row's all of them."""
    experts, placed, pool = layers
    rng = np.random.default_rng(n + 10 * rows)
    t = 8
    x, out = np.zeros((t, H), np.float32), np.zeros((t, H), np.float32)
    ids, w = np.zeros((t, K), np.int64), np.zeros((t, K), np.float32)
    ready, done = np.zeros(3, np.int64), np.zeros(3, np.int64)
    deferral = Deferral(H, K)
    gpu = FakeGpu((x, ids, w, out), ready, done, poison=True)
    for seq in (1, 2):
        inputs = [(rng.standard_normal((n, H)).astype(np.float32),
                   _held_off(rng, np.stack([rng.choice(E, K, replace=False) for _ in range(n)]),
                             held),
                   rng.random((n, K)).astype(np.float32)) for _ in experts]
        gpu.start(seq, inputs)
        if driver == "python":
            deferral.begin_step()
            for layer, (p, k) in enumerate(zip(placed, deferred_ks(ks))):
                assert wait_equal(ready, layer, seq, 10 * SECOND)
                run = lambda xi, ii, wi, oi, p=p: pool.run_inline(xi, ii, wi, p, oi)
                deferral.now(run, x[:n], ids[:n], w[:n], out[:n], int(k), rows)
                set_flag(done, layer, seq)
                deferral.later(run)
        else:
            assert drive_layers(ready, done, seq, n, x, ids, w, out, packed_layers(placed),
                                10 * SECOND, one_region=driver == "region",
                                deferred=deferred_ks(ks), rows=rows) == 3
        got = gpu.join()
        for g, want in zip(got, protocol(experts, inputs, deferred_ks(ks), rows), strict=True):
            np.testing.assert_array_equal(g, want)
        if held == 1.0:  # nothing on the CPU: nothing now, nothing deferred
            assert all(not g.any() for g in got)


def _held_off(rng, ids: np.ndarray, held: float) -> np.ndarray:
    """ids [n, K] with a share `held` of slots -1, all of row 0's where held > 0."""
    if held:
        ids = np.where(rng.random(ids.shape) < held, -1, ids)
        ids[0] = -1
    return ids
