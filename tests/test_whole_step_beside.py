"""Work beside a whole-step decode graph (a prompt's layers launched while the CPU experts run):
`beside` runs on another thread at the same time as the CPU experts are driven on the caller's
(the thread that warmed them up), a replay returns only after both finished, and a failure on
either side propagates after both finished. The graph and the driver are stand-ins (CUDA graphs need a
GPU; tests/gpu_kernels/test_engine_gpu_path.py runs the real ones there)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch

from hybrid.engine.graphs.whole_step import WholeStepGraphs
from hybrid.errors import DeviceLost


class Driver:
    """HostExperts' stand-in: run answers a step only once `release` is set (as the real
    driver waits for the GPU's flags; `beside` sets it); each call records its thread."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.release, self.fail, self.calls = threading.Event(), fail, []
        self.prepared, self.waited = [], []

    def prepare(self, seq: int, n: int) -> None:
        self.prepared.append((seq, n, threading.current_thread().name))

    def wait_driving(self) -> None:
        self.waited.append(threading.current_thread().name)

    def run(self, seq: int, n: int) -> None:
        self.calls.append((seq, n, threading.current_thread().name))
        assert self.release.wait(5), "the driver was never released: beside ran after it"
        if self.fail is not None:
            raise self.fail


def graphs(driver: Driver) -> WholeStepGraphs:
    g = WholeStepGraphs.__new__(WholeStepGraphs)  # no CUDA: the parts replay() reads
    g.program = SimpleNamespace(bridge=SimpleNamespace(gave_up=False, stage_seq=lambda: 7))
    g.host, g.device = driver, torch.device("cpu")
    g._beside = ThreadPoolExecutor(1, thread_name_prefix="hybrid-beside-step")
    return g


def test_beside_runs_while_the_experts_are_driven() -> None:
    driver = Driver()
    g = graphs(driver)
    seen = []

    def beside() -> None:
        seen.append(threading.current_thread().name)
        driver.release.set()  # would never happen if beside ran after the driver

    g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=3), beside)
    assert seen[0].startswith("hybrid-beside-step")
    assert driver.calls == [(7, 3, threading.current_thread().name)]
    # bound before beside's thread starts; that thread waits for the driver's region first
    assert driver.prepared == [(7, 3, threading.current_thread().name)]
    assert driver.waited == seen


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
        driver.release.set()
        raise RuntimeError("a launch failed")

    def run_driver(seq, n):
        Driver.run(driver, seq, n)
        finished.append(True)
    g.host = SimpleNamespace(run=run_driver, prepare=driver.prepare,
                             wait_driving=driver.wait_driving)
    with pytest.raises(RuntimeError, match="a launch failed"):
        g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=1), failing)
    assert finished == [True]  # the driver answered the step before the error came up

    launched = []  # the driver fails first: beside's launches still finish before the raise
    g = graphs(Driver(fail=DeviceLost("lost")))
    g.host.release.set()

    def slow() -> None:
        threading.Event().wait(0.05)
        launched.append(True)
    with pytest.raises(DeviceLost):
        g.replay(SimpleNamespace(replay=lambda: None), SimpleNamespace(num_real=1), slow)
    assert launched == [True]
