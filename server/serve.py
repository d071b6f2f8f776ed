"""`hybrid serve`: load the model, start the engine worker, and run uvicorn."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from hybrid.engine.sampling_params import SamplingParams
from server.config import ServerConfig
from server.state import ServedModel, ServerState

log = logging.getLogger(__name__)
DEMO_MODEL_NAME = "demo"  # what clients call the built-in demo model


def build_state(config: ServerConfig, progress: Callable[[int, int], None] | None = None,
                warmup: bool = True) -> ServerState:
    """Load the model and start its worker thread; the caller shuts the worker down."""
    from hybrid.engine.llm import LLM
    from hybrid.tokenizer.bundled_templates import load_template

    engine = config.engine
    template = load_template(config.chat_template) if config.chat_template else None
    llm = LLM(engine.gguf_path, engine.optimize_rules, progress=progress, engine_config=engine,
              status=_status_line)
    if template is not None:
        llm.tokenizer.use_chat_template(template)
    if warmup:
        # One tiny generation compiles the CPU kernels now, so the first client does not wait.
        for _ in llm.stream([llm.tokenizer.bos_token_id or 0], SamplingParams(temperature=0,
                                                                               max_tokens=2)):
            pass
    name = config.served_model_name or (
        DEMO_MODEL_NAME if engine.gguf_path is None else _model_name(llm.loaded.gguf.path))
    model = ServedModel(name, llm.tokenizer, llm.loaded.spec.vocab_size,
                        llm.loaded.spec.context_length, llm.tokenizer.eos_token_id,
                        llm.engine.scheduler.max_request_tokens)
    worker = llm.worker
    worker.start()
    return ServerState(config, model, worker)


def _status_line(message: str) -> None:
    print(f"start-up: {message}", file=sys.stderr, flush=True)


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

    logging.basicConfig(level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    state = build_state(config, progress)
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
    auth = "API key required" if config.api_key else "no API key"
    print(f"serving {state.model.name!r} on http://{config.host}:{config.port}/v1 ({auth}; "
          f"max {config.engine.max_batch_size} requests per batch, KV cache "
          f"{config.engine.cache_lens} tokens)", file=sys.stderr)
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)
    finally:
        state.worker.shutdown()
        if writer is not None:
            writer.stop()
    return 0
