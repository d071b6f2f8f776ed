"""The serving process's life: the engine on the main thread, HTTP on another, and a shutdown
that drains.

The engine steps on the thread that loaded the model and ran its warm-up (a thread started
later decodes slower: docs/serving.md). uvicorn runs on a thread of its own and installs no
signal handlers there, so they are installed here.

SIGTERM or SIGINT drains: from then on every request gets a 503 with Retry-After (and /health
too, so a load balancer moves traffic away), the requests already admitted run to their end for
up to `shutdown_timeout` seconds, then what is left is cancelled, uvicorn stops and the process
exits 0. A second signal stops at once.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

log = logging.getLogger("hybrid.server")


def run_engine_and_http(worker, server, sock, draining: threading.Event,
                        shutdown_timeout: float) -> None:
    """Serve until a signal (then drain) or until uvicorn stops by itself. worker: an
    EngineWorker not started; server: a uvicorn.Server; sock: its bound listening socket."""

    def stop_now() -> None:
        worker.shutdown()  # cancels whatever still runs or waits
        server.should_exit = True

    def finish() -> None:
        deadline = time.monotonic() + shutdown_timeout
        while worker.has_work and time.monotonic() < deadline:
            time.sleep(0.05)
        if worker.has_work:
            log.warning("shutdown: cancelling the requests still running after %.0f s",
                        shutdown_timeout)
        stop_now()

    def on_signal(signum, _frame) -> None:
        if draining.is_set():
            stop_now()
            return
        draining.set()
        stats = worker.stats()
        print(f"shutting down: admitting nothing more, finishing {stats.num_running} running "
              f"and {stats.num_waiting} queued requests (up to {shutdown_timeout:.0f} s; "
              f"signal again to stop now)", file=sys.stderr, flush=True)
        threading.Thread(target=finish, name="hybrid-drain", daemon=True).start()

    def serve_http() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            worker.shutdown()  # uvicorn stopped (or failed): so does the engine

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    http = threading.Thread(target=serve_http, name="hybrid-http", daemon=True)
    http.start()
    try:
        worker.run()
    finally:
        server.should_exit = True
        http.join(30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def server_options() -> dict:
    """uvicorn settings every served process uses (`hybrid serve`, server/inprocess.py): once
    stopping, open connections (streams the engine has ended) get 10 s to close."""
    return {"timeout_graceful_shutdown": 10}
