"""A real uvicorn server on 127.0.0.1 for the server tests, plus config/CLI checks (no model).

`live_server` is a module-scoped fixture: test modules import it. The engine is loaded from the
tiny synthetic V3 with cpu.yaml; `max_batch_size` 2 lets tests see queued requests.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from hybrid.errors import HybridError
from server.config import ServerConfig
from server.inprocess import InProcessServer

API_KEY = "test-key"
MAX_NEW_TOKENS = 200  # the server's cap: long enough to disconnect mid-stream, short to clamp
MAX_REQUEST_BYTES = 64 * 1024


class LiveServer(InProcessServer):
    """The served app in a thread (server/inprocess.py), with the tests' helpers."""

    @functools.cached_property
    def llm(self):
        """An offline `LLM` on the same file and settings, for reference outputs: the served
        engine belongs to its worker thread."""
        from hybrid.engine.llm import LLM

        engine = self.state.config.engine
        return LLM(engine.gguf_path, engine.optimize_rules, engine_config=engine)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def wait_idle(self, timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if h["num_running"] == 0 and h["num_waiting"] == 0:
                return h
            assert time.monotonic() < deadline, f"the engine stayed busy: {h}"
            time.sleep(0.02)

    def close(self) -> None:
        self.stop()


@pytest.fixture(scope="module")
def live_server(models) -> Iterator[LiveServer]:
    from server.serve import build_state

    config = ServerConfig.from_flat({
        "gguf_path": str(models.path("tiny-v3", "q4_k_m")), "optimize_rules": "cpu.yaml",
        "max_batch_size": 2, "max_new_tokens": MAX_NEW_TOKENS, "api_key": API_KEY,
        "max_request_bytes": MAX_REQUEST_BYTES,
    })
    server = LiveServer(build_state(config))
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("values,message", [
    ({"port": 70000}, "port must be between"),
    ({"max_new_tokens": 0}, "max_new_tokens must be at least 1"),
    ({"api_key": " "}, "api_key must not be empty"),
    ({"max_batch_size": 0}, "max_batch_size must be between"),
    ({"max_request_bytes": 10}, "max_request_bytes must be at least"),
    ({"log_level": "loud"}, "log_level must be one of"),
    ({"chunk_size": 0}, "chunk_size must be between"),
    ({"frobnicate": 4}, "unknown server setting(s): frobnicate"),
])
def test_server_config_rejects_bad_values(values: dict, message: str) -> None:
    with pytest.raises(HybridError) as e:
        ServerConfig.from_flat(values)
    assert message in str(e.value)


def test_serve_cli_bad_flags_are_one_line_errors(capsys) -> None:
    from cli.main import main

    assert main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err == "error: port must be between 0 and 65535, got 70000\n"
    with pytest.raises(SystemExit) as e:  # argparse: unknown flags and wrong types
        main(["serve", "--max-batch-size", "many"])
    assert e.value.code == 2


def test_serve_cli_defaults_come_from_the_config() -> None:
    from cli.main import build_parser

    args = build_parser().parse_args(["serve"])
    d = ServerConfig()
    assert (args.host, args.port, args.max_new_tokens, args.max_batch_size, args.api_key,
            args.gguf_path) == (d.host, d.port, d.max_new_tokens, d.engine.max_batch_size,
                                d.api_key, d.engine.gguf_path)
    assert (args.chunk_size, args.cache_lens, args.page_size, args.cpu_threads,
            args.force_think) == (d.engine.chunk_size, d.engine.cache_lens, d.engine.page_size,
                                  d.engine.cpu_threads, d.force_think)
    assert d.host == "127.0.0.1"


def test_serve_cli_passes_every_flag_to_the_config(monkeypatch) -> None:
    import server.serve
    from cli.main import main

    seen = []
    monkeypatch.setattr(server.serve, "serve", lambda config, progress=None: seen.append(config)
                        or 0)
    assert main(["serve", "--chunk-size", "128", "--cache-lens", "4096", "--page-size", "32",
                 "--cpu-threads", "3", "--force-think", "--max-batch-size", "4"]) == 0
    (config,) = seen
    assert (config.engine.chunk_size, config.engine.cache_lens, config.engine.page_size,
            config.engine.cpu_threads, config.engine.max_batch_size, config.force_think) == (
        128, 4096, 32, 3, 4, True)
    assert main(["serve", "--page-size", "64", "--cache-lens", "32"]) == 2  # one-line error


def test_serve_fails_at_once_on_a_port_in_use_before_loading(capsys, monkeypatch) -> None:
    """The address is bound before the model loads: a port in use is one line, no loading."""
    import server.serve
    from cli.main import main

    monkeypatch.setattr(server.serve, "build_state", _no_loading)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: port {port} on 127.0.0.1 is already in use")
    assert "--port" in err


@pytest.mark.parametrize("host", ["no-such-host.invalid", "10.255.255.254", "300.1.1.1"])
def test_serve_fails_at_once_on_a_bad_host(capsys, monkeypatch, host: str) -> None:
    import server.serve
    from cli.main import main

    monkeypatch.setattr(server.serve, "build_state", _no_loading)
    assert main(["serve", "--host", host, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and host in err and "--host" in err
    assert err.count("\n") == 1


def test_serve_fails_at_once_on_a_trace_it_cannot_write(capsys, monkeypatch, tmp_path) -> None:
    import server.serve
    from cli.main import main

    monkeypatch.setattr(server.serve, "build_state", _no_loading)
    path = tmp_path / "no-such-folder" / "steps.jsonl"
    assert main(["serve", "--port", "0", "--trace-steps", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --trace-steps {path}: cannot write it")
    assert err.count("\n") == 1


def test_bound_listener_is_refused_until_served() -> None:
    """Bound but not listening: a client is refused (not left hanging) while the model loads."""
    from server.listen import bind_listener, bound_url

    sock = bind_listener("127.0.0.1", 0)
    try:
        url = bound_url(sock)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        sock.close()


def _no_loading(*args, **kwargs):
    raise AssertionError("the model must not load when the address cannot be bound")
