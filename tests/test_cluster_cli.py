"""`hybrid cluster` as a user runs it: one replica of the demo model on a local Ray instance
answers on the port it printed, a port in use fails before anything loads, and Ctrl-C stops
it. Skipped without the `cluster` extra (ray[serve])."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("ray.serve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cluster_command_serves_and_stops(tmp_path):
    port = _free_port()
    env = {**os.environ, "RAY_ADDRESS": ""}
    log = open(tmp_path / "cluster.log", "w+")  # noqa: SIM115 - a pipe could fill and block it
    proc = subprocess.Popen([sys.executable, "-m", "cli", "cluster", "--replicas", "1",
                             "--replica-cpus", "1", "--port", str(port), "--cache-lens", "1024"],
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline, models = time.monotonic() + 600, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                if models.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        assert models is not None and models.status_code == 200, \
            (tmp_path / "cluster.log").read_text()[-3000:]
        assert models.json()["data"][0]["id"] == "demo"
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                       json={"model": "demo", "prompt": "Hello", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # the proxy may route before the command has printed its line (serve.run returning)
        line = f"serving on http://127.0.0.1:{port}/v1 with 1 replicas"
        deadline = time.monotonic() + 120
        while line not in (tmp_path / "cluster.log").read_text() \
                and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    out = (tmp_path / "cluster.log").read_text()
    assert proc.returncode == 0, out[-3000:]
    assert line in out


def test_a_port_in_use_fails_before_loading():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "cli", "cluster", "--port", str(port)],
                              check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "already in use" in done.stderr
    assert time.monotonic() - t < 30  # the import of torch and ray included: no model loaded


def test_a_replicas_threads_leave_cores_to_ray_and_to_the_gpu_thread():
    from cpu_kernels.runtime.topology import physical_cores
    from server.replicas.deployment import RAY_CORES, replica_threads

    logical, physical = os.cpu_count() or 1, physical_cores()
    assert replica_threads(logical) == max(1, max(1, physical - RAY_CORES) - 1)
    assert replica_threads(logical / 2) == max(1, round(max(1, physical - RAY_CORES) / 2) - 1)
    assert replica_threads(0.5) == 1
