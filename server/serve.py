"""`hybrid serve`: load the model, start the engine worker, and run uvicorn."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hybrid.engine.sampling.sampling_params import SamplingParams
from server.config import ServerConfig
from server.state import ChatTraits, ServedModel, ServerState

log = logging.getLogger(__name__)
DEMO_MODEL_NAME = "demo"  # what clients call the built-in demo model
_STARTED = time.monotonic()  # this module loads at the start of `hybrid serve`


def build_state(config: ServerConfig, progress: Callable[[int, int], None] | None = None,
                warmup: bool = True, start: bool = True) -> ServerState:
    """Load the model and start its worker thread (with `start`; else the caller may step the
    engine itself first, then starts it); the caller shuts the worker down."""
    from hybrid.engine.llm import LLM
    from hybrid.tokenizer.bundled_templates import load_template

    engine = config.engine
    template = load_template(config.chat_template) if config.chat_template else None
    _status_line("loading the model")
    llm = LLM(engine.gguf_path, engine.optimize_rules, progress=progress, engine_config=engine,
              status=_status_line)
    if template is not None:
        llm.tokenizer.use_chat_template(template)
    if warmup:
        # numba compiles the CPU expert kernels here on a first start (about a minute), and
        # loads them from its cache on later ones
        _status_line("a first generation (a first start compiles the CPU kernels: ~1 min)")
        # One tiny generation compiles the CPU kernels now, so the first client does not wait.
        for _ in llm.stream([llm.tokenizer.bos_token_id or 0], SamplingParams(temperature=0,
                                                                               max_tokens=2)):
            pass
    name = config.served_model_name or (
        DEMO_MODEL_NAME if engine.gguf_path is None else _model_name(llm.loaded.gguf.path))
    model = ServedModel(name, llm.tokenizer, llm.loaded.spec.vocab_size,
                        llm.loaded.spec.context_length, llm.tokenizer.eos_token_id,
                        llm.engine.scheduler.max_request_tokens, ChatTraits.of(llm.tokenizer))
    _status_line("ready")
    if start:
        llm.worker.start()
    return ServerState(config, model, llm.worker)


def _status_line(message: str) -> None:
    # seconds since the process started: which phase of a slow start took the time
    print(f"start-up [{time.monotonic() - _STARTED:5.1f} s]: {message}", file=sys.stderr,
          flush=True)


def _model_name(path: Path) -> str:
    # "DeepSeek-V3-Q4_K_M-00001-of-00009.gguf" -> "DeepSeek-V3-Q4_K_M"
    stem = Path(path).name.removesuffix(".gguf")
    parts = stem.rsplit("-", 3)
    if len(parts) == 4 and parts[2] == "of" and parts[1].isdigit() and parts[3].isdigit():
        stem = parts[0]
    return stem


def serve(config: ServerConfig, progress: Callable[[int, int], None] | None = None) -> int:
    import uvicorn

    from hybrid.engine.heap import freeze_start_up_heap
    from server.app import create_app
    from server.lifecycle import run_engine_and_http, server_options
    from server.listen import bind_listener, bound_url

    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # NOTE: bound before loading, so a port in use or a bad --host fails in a moment, not after
    # minutes of loading; clients are refused until uvicorn listens on it.
    sock = bind_listener(config.host, config.port)
    try:
        trace = None
        if config.trace_steps:  # opened before loading too: a bad path fails at once
            from hybrid.engine.step_trace import StepTrace

            trace = StepTrace(config.trace_steps)
        state = build_state(config, progress, start=False)
    except BaseException:
        sock.close()
        raise
    # This process serves one engine for its life: the collector need not walk start-up's
    # objects again (a full collection was a host stall in one step; hybrid/engine/heap.py).
    frozen = freeze_start_up_heap()
    log.debug("froze %d objects left by start-up", frozen)
    app = create_app(state)
    writer = None
    if config.routing_profile:
        from server.routing_writer import RoutingWriter

        writer = RoutingWriter(state.worker.engine, state.model.name, config.routing_profile)
        writer.start()
    state.worker.trace = trace
    auth = "API key required" if config.api_key else "no API key"
    print(f"serving {state.model.name!r} on {bound_url(sock)}/v1 ({auth}; "
          f"max {config.engine.max_batch_size} requests per batch, KV cache "
          f"{state.worker.engine.config.cache_lens} tokens)", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, log_level=config.log_level,
                                           **server_options()))
    try:
        run_engine_and_http(state.worker, server, sock, state.draining,
                            config.shutdown_timeout)
    finally:
        if writer is not None:
            writer.stop()
        if state.worker.trace is not None:
            state.worker.trace.close()
    code = 0
    if state.worker.fatal is not None:
        print(f"error: the GPU failed ({state.worker.fatal}); the server stopped: restart it "
              f"(the log above has the failing step)", file=sys.stderr)
        code = 1
    # Everything is stopped and written: leave without the interpreter's teardown, where
    # Triton's bindings print hundreds of lines of "leaked" objects after a clean shutdown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

