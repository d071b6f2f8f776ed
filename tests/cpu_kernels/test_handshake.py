"""The flag waits of cpu_kernels/runtime/handshake.py against a second thread's stores."""

from __future__ import annotations

import threading

import numpy as np

from cpu_kernels.runtime.handshake import set_flag, wait_at_least, wait_equal
from cpu_kernels.simd.clock import cycles_per_us

SECOND = int(1e6 * cycles_per_us())


def later(flags: np.ndarray, index: int, value: int) -> threading.Timer:
    timer = threading.Timer(0.02, set_flag, (flags, index, value))
    timer.start()
    return timer


def test_wait_equal_sees_another_threads_store_and_times_out_without_it():
    flags = np.zeros(3, np.int64)
    later(flags, 1, 5)
    assert wait_equal(flags, 1, 5, 10 * SECOND)
    assert not wait_equal(flags, 2, 5, SECOND // 100)


def test_wait_at_least_takes_any_larger_value():
    stamps = np.array([0, 100], np.int64)
    assert wait_at_least(stamps, 1, 100, 0)  # already there: no wait, even with no time
    assert wait_at_least(stamps, 1, 50, 0)
    later(stamps, 0, 70)  # past the value, not equal to it
    assert wait_at_least(stamps, 0, 60, 10 * SECOND)
    assert not wait_at_least(stamps, 0, 71, SECOND // 100)
