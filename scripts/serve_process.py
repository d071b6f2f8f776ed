"""A server started as its own process on a free loopback port, as a user starts it, for the
benchmarks in this folder: ready once /health answers 200, stopped with SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def synthetic_model(preset: str, folder: str) -> str:
    """`make-model --preset preset --quant q4_k_m` written into `folder` -> its path."""
    path = str(Path(folder) / f"{preset}.gguf")
    subprocess.run([sys.executable, "-m", "cli", "make-model", "--preset", preset, "--quant",
                    "q4_k_m", "--out", path], check=True, capture_output=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`argv` started with its output to `log_path` (None: inherited); `startup_s` is the time
    from the start to the first 200 from /health. RuntimeError if it exits or stays down for
    `timeout` seconds."""

    def __init__(self, argv: list[str], name: str, port: int, log_path: str | None = None,
                 timeout: float = 1800) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = open(log_path, "w") if log_path else None  # noqa: SIM115 - closed in stop()
        start = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=self.log,
                                     stderr=subprocess.STDOUT if self.log else None)
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.perf_counter() - start > timeout:
                self.stop()
                raise RuntimeError(f"{name} did not start (see {log_path or 'its output'})")
            time.sleep(0.5)
        self.startup_s = time.perf_counter() - start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()
