"""N replicas of the engine behind one OpenAI- and Ollama-compatible endpoint, on Ray Serve.

    client -> Ray Serve's HTTP proxy -> Ingress (one) -> EngineReplica (N, router.py picks)

Each EngineReplica loads the model as `hybrid serve` does (server/serve.py: build_state) on the
GPUs and CPUs Ray gives it, and runs every request it gets through its own served app
(asgi_call.py): routes, validation, errors and streaming are `hybrid serve`'s. The ingress
reads the request, derives its affinity key and streams the replica's response back.

- A replica whose engine failed (a lost GPU) fails Ray's health check and is replaced; a
  replica that dies mid-request fails that request cleanly (a 503 before the response began,
  an error event and the end of the stream after), and the others keep serving.
- GET /metrics at the ingress: every live replica's metrics, labelled replica="...", and GET
  /health: their counters summed, each replica's beside, both from the MetricsBoard they each
  push to once a second (a replica gone for 5 s drops out; none left: /health answers 503).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import asdict, replace

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from server.config import ServerConfig
from server.errors import APIError
from server.middleware import api_key_refusal
from server.replicas.asgi_call import HttpCall, ResponseStart, run_asgi
from server.replicas.metrics_merge import merge, merge_health
from server.replicas.router import AffinityRouter

log = logging.getLogger("hybrid.cluster")
APP_NAME = "hybrid"
BOARD_NAME = "hybrid-metrics-board"
PUSH_S, STALE_S = 1.0, 5.0
# Cores a machine leaves to Ray's own processes (its HTTP proxy, the ingress, raylet, GCS),
# which pass every streamed token between processes: a kernel thread they displace holds up
# its whole parallel region (docs/tuning.md has how the count was chosen).
RAY_CORES = 4


@ray.remote(num_cpus=0)
class MetricsBoard:
    """The replicas' latest /metrics texts and /health answers, by replica."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[float, str, dict]] = {}

    def put(self, replica: str, text: str, health: dict) -> None:
        self.reports[replica] = (time.monotonic(), text, health)

    def _live(self) -> dict[str, tuple[float, str, dict]]:
        now = time.monotonic()
        return {r: x for r, x in sorted(self.reports.items()) if now - x[0] < STALE_S}

    def merged(self) -> str:
        return merge({r: text for r, (_, text, _) in self._live().items()})

    def health(self) -> dict | None:
        """The live replicas' /health merged; None when none reported lately."""
        live = {r: h for r, (_, _, h) in self._live().items()}
        return merge_health(live) if live else None


def metrics_board():
    return MetricsBoard.options(name=BOARD_NAME, namespace=APP_NAME, get_if_exists=True,
                                lifetime="detached").remote()


class EngineReplica:
    """One engine and its served app, in a Ray Serve replica."""

    def __init__(self, config: ServerConfig) -> None:
        from server.app import create_app
        from server.serve import build_state

        self.state = build_state(config)
        self.app = create_app(self.state)
        self.name = serve.get_replica_context().replica_id.unique_id
        self.board = metrics_board()
        self._stop = threading.Event()
        threading.Thread(target=self._push_metrics, name="hybrid-metrics-push",
                         daemon=True).start()

    async def handle(self, call: HttpCall):
        async for part in run_asgi(self.app, call):
            yield part

    def check_health(self) -> None:
        """Ray Serve's health check: a failed engine gets this replica replaced."""
        if self.state.worker.fatal is not None:
            raise RuntimeError(f"the engine failed: {self.state.worker.fatal}")

    def _push_metrics(self) -> None:
        metrics = self.app.state.metrics
        while not self._stop.wait(PUSH_S):
            stats = self.state.worker.stats()
            health = {"status": "ok", "model": self.state.model.name, **asdict(stats)}
            try:
                self.board.put.remote(self.name, metrics.render(stats), health)
            except Exception:  # noqa: BLE001 - the board is gone (shutting down): stop
                return

    def __del__(self) -> None:
        self._stop.set()
        self.state.worker.shutdown()


class Ingress:
    """Every HTTP request: /metrics and /health merged here, the rest to an engine replica."""

    def __init__(self, engine, api_key: str | None) -> None:
        self.engine = engine.options(stream=True)
        self.board = metrics_board()
        self.api_key = api_key

    async def __call__(self, request: Request) -> Response:
        if request.url.path == "/health" and request.method == "GET":
            health = await self.board.health.remote()
            if health is None:
                return JSONResponse({"status": "unavailable", "error": "no engine replica has "
                                     f"reported in the last {STALE_S:g} s"}, status_code=503)
            return JSONResponse(health)
        if request.url.path == "/metrics" and request.method == "GET":
            given = request.headers.get("authorization")
            err = self.api_key and api_key_refusal(
                None if given is None else given.encode("latin-1"), self.api_key)
            if err:
                return err.response(request.url.path)
            text = await self.board.merged.remote()
            return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")
        call = await HttpCall.of(request)
        parts = self.engine.handle.remote(call)
        try:
            start = await parts.__anext__()
        except Exception as e:  # noqa: BLE001 - a replica died or failed before answering
            log.warning("a replica failed before answering %s %s: %s", call.method, call.path, e)
            return _replica_lost(call.path)
        if not isinstance(start, ResponseStart):
            return _replica_lost(call.path)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.headers
                   if k.lower() not in (b"content-length", b"transfer-encoding")}
        sse = headers.get("content-type", "").startswith("text/event-stream")

        async def body():
            try:
                async for chunk in parts:
                    yield chunk
            except asyncio.CancelledError:
                parts.cancel()
                raise
            except Exception as e:  # noqa: BLE001 - the replica died mid-stream
                log.warning("a replica failed mid-response on %s: %s", call.path, e)
                if sse:
                    yield b"data: " + json.dumps(_LOST.body_for(call.path)).encode() + b"\n\n"
        return StreamingResponse(body(), status_code=start.status, headers=headers)


_LOST = APIError(503, "the replica serving this request stopped; retry it (the others still "
                 "serve)", type="server_error", code="replica_lost")


def _replica_lost(path: str) -> Response:
    response = _LOST.response(path)
    response.headers["Retry-After"] = "1"
    return response


def replica_threads(cpus: float) -> int:
    """CPU expert threads for a replica given `cpus` of this machine's logical CPUs: its share
    of the physical cores less RAY_CORES, less one (left to the thread that drives the GPU,
    as `hybrid serve` leaves it), at least 1. A kernel thread on every core would share cores
    with Ray's processes, and a parallel region waits for its slowest thread each layer."""
    from cpu_kernels.runtime.topology import physical_cores

    share = cpus * max(1, physical_cores() - RAY_CORES) / (os.cpu_count() or 1)
    return max(1, round(share) - 1)


def build_app(config: ServerConfig, replicas: int, gpus: float, cpus: float,
              max_ongoing: int | None = None):
    """The Serve application: an ingress and `replicas` EngineReplicas of `config`, each with
    `gpus` GPUs and `cpus` CPUs (its CPU experts' threads: replica_threads(cpus), unless
    config sets them; the machines of a Ray cluster taken to be like this one).
    max_ongoing: requests in flight a replica takes before the router looks elsewhere
    (default: its batch, so a request queues behind a full batch only where every replica's
    is full; Ray Serve holds it until one has room)."""
    engine_config = config.engine
    if engine_config.cpu_threads is None:
        engine_config = replace(engine_config, cpu_threads=replica_threads(cpus))
    config = replace(config, engine=engine_config)
    engine = serve.deployment(
        EngineReplica, name="engine", num_replicas=replicas,
        ray_actor_options={"num_gpus": gpus, "num_cpus": cpus},
        max_ongoing_requests=max_ongoing or engine_config.max_batch_size,
        request_router_config=RequestRouterConfig(request_router_class=AffinityRouter),
        health_check_period_s=2, health_check_timeout_s=30,
        graceful_shutdown_timeout_s=config.shutdown_timeout)
    ingress = serve.deployment(Ingress, name="ingress", num_replicas=1,
                               max_ongoing_requests=10_000, ray_actor_options={"num_cpus": 0})
    return ingress.bind(engine.bind(config), config.api_key)


def start(config: ServerConfig, replicas: int, gpus: float, cpus: float,
          address: str | None = None, max_ongoing: int | None = None) -> str:
    """Start a Ray instance of this process's own (or join one, with `address`: "auto" or
    ray://...), serve the app on config.host:config.port and return its URL once every
    replica is ready."""
    if not ray.is_initialized():
        # "local": a new instance even where another process's runs on this machine
        ray.init(address=address or "local", namespace=APP_NAME, log_to_driver=True,
                 include_dashboard=False if address is None else None)
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(build_app(config, replicas, gpus, cpus, max_ongoing), name=APP_NAME,
              route_prefix="/")
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    return f"http://{host}:{config.port}"


def stop() -> None:
    """Take the app down and its metrics board with it (the Ray instance stays)."""
    serve.shutdown()
    try:
        ray.kill(ray.get_actor(BOARD_NAME, namespace=APP_NAME))
    except ValueError:
        pass
