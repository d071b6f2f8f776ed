"""`hybrid serve --record-routing FILE`: the live traffic's routing profile, rewritten every
`interval` seconds (atomically) and once more at shutdown, for `hybrid tune`."""

from __future__ import annotations

import logging
import threading

from hybrid.tuning.profile import RoutingProfile

log = logging.getLogger("hybrid.server")


class RoutingWriter:
    def __init__(self, engine, model_file: str, path: str, interval: float = 30.0) -> None:
        self.engine, self.model_file, self.path, self.interval = engine, model_file, path, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hybrid-routing", daemon=True)

    def start(self) -> None:
        self.write()  # the file exists (empty) from the start: a bad path fails now
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.write()

    def write(self) -> None:
        RoutingProfile.of_engine(self.engine, self.model_file).save(self.path)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write()
            except OSError as e:  # a full disk must not take the server down
                log.warning("could not write the routing profile %s: %s", self.path, e)
