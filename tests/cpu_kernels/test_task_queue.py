"""claim(): every index handed out exactly once, however the threads interleave."""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from cpu_kernels.simd.task_queue import claim


@njit(parallel=True, cache=True)
def _claim_all(num_tasks: int, workers: int, chunk: int) -> np.ndarray:
    counter = np.zeros(1, np.int64)
    runs = np.zeros(num_tasks, np.int64)
    for _ in prange(workers):
        c = claim(counter)
        while c * chunk < num_tasks:
            for task in range(c * chunk, min(num_tasks, (c + 1) * chunk)):
                runs[task] += 1  # no other worker holds this task
            c = claim(counter)
    return runs


def test_claim_hands_out_each_task_once() -> None:
    numba.set_num_threads(2)
    for num_tasks, workers, chunk in [(0, 2, 4), (1, 2, 4), (1001, 2, 3), (5000, 7, 1), (9, 1, 4)]:
        runs = _claim_all(num_tasks, workers, chunk)
        assert np.array_equal(runs, np.ones(num_tasks, np.int64)), (num_tasks, workers, chunk)
