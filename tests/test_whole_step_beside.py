"""Work beside a whole-step decode graph (a prompt's layers launched while the CPU experts run):
the CPU experts are driven on another thread at the same time as `beside` runs on the caller's,
a replay returns only after the driver answered the step, and a failure on either side
propagates after both finished. The graph and the driver are stand-ins (CUDA graphs need a
GPU; tests/gpu_kernels/test_engine_gpu_path.py runs the real ones there)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from hybrid.engine.graphs.whole_step import WholeStepGraphs
from hybrid.errors import DeviceLost


class Driver:
    """HostExperts.run's stand-in: answers a step only once `release` is set (as the real
    driver waits for the GPU's flags), recording its thread."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.release, self.fail, self.calls = threading.Event(), fail, []

    def run(self, seq: int, n: int) -> None:
        self.calls.append((seq, n, threading.current_thread().name))
        assert self.release.wait(5), "the driver was never released: beside ran after it"
        if self.fail is not None:
            raise self.fail


def graphs(driver: Driver) -> WholeStepGraphs:
    g = WholeStepGraphs.__new__(WholeStepGraphs)  # no CUDA: the parts replay() reads
    g.program = SimpleNamespace(bridge=SimpleNamespace(gave_up=False, next_seq=lambda: 7))
    g.host = driver
    g._driver = ThreadPoolExecutor(1, thread_name_prefix="hybrid-experts-driver")
    return g


def test_beside_runs_while_the_experts_are_driven() -> None:
    driver = Driver()
    g = graphs(driver)
    seen = []

    def beside() -> None:
        seen.append(threading.current_thread() is threading.main_thread())
        driver.release.set()  # would never happen if the driver ran first on this thread

    g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=3), beside)
    assert seen == [True]
    assert driver.calls == [(7, 3, driver.calls[0][2])]
    assert driver.calls[0][2].startswith("hybrid-experts-driver")


def test_without_beside_the_caller_drives() -> None:
    driver = Driver()
    driver.release.set()
    g = graphs(driver)
    g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=1))
    assert driver.calls[0][2] == threading.current_thread().name


def test_failures_propagate_after_the_step_is_answered() -> None:
    driver = Driver(fail=DeviceLost("the GPU did not hand over MoE layer 0's rows"))
    g = graphs(driver)
    with pytest.raises(DeviceLost, match="did not hand over"):
        g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=1),
                 driver.release.set)

    driver = Driver()
    g = graphs(driver)
    finished = []

    def failing() -> None:
        threading.Timer(0.05, driver.release.set).start()
        raise RuntimeError("a launch failed")

    def run_driver(seq, n):
        Driver.run(driver, seq, n)
        finished.append(True)
    g.host = SimpleNamespace(run=run_driver)
    with pytest.raises(RuntimeError, match="a launch failed"):
        g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=1), failing)
    assert finished == [True]  # the replay waited for the driver before raising
