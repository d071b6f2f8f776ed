"""The served app on a loopback port in a thread of this process (tests and benchmarks).

The same app and uvicorn `hybrid serve` runs, on a free port bound first (held from then on, so
parallel tests never race for one), started before the constructor returns.
"""

from __future__ import annotations

import threading
import time

from server.lifecycle import server_options
from server.listen import bind_listener, bound_url
from server.state import ServerState


class InProcessServer:
    def __init__(self, state: ServerState, start_timeout: float = 20) -> None:
        import uvicorn

        from server.app import create_app

        self.state = state
        sock = bind_listener("127.0.0.1", 0)
        self.url = bound_url(sock)
        config = uvicorn.Config(create_app(state), log_level="warning", lifespan="off",
                                **server_options())
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop uvicorn and the engine worker."""
        self.server.should_exit = True
        self.thread.join(10)
        self.state.worker.shutdown()

