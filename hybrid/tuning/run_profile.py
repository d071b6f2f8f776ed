"""`hybrid profile`: run a file of prompts through the engine with routing recorded.

Prompts are JSON lines: {"prompt": "text"} (a completion), {"messages": [...]} (a chat,
rendered by the file's template), or a bare JSON string. They run `batch` at a time through
continuous batching, each generating up to `max_tokens` tokens, so prompt and decode routing
are both seen as they are in serving.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybrid.errors import HybridError
from hybrid.tuning.profile import RoutingProfile


def read_prompts(path: str | Path) -> list[Any]:
    """The prompts of a JSON-lines file: each a str (completion) or a list of messages."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise HybridError(f"cannot read the prompts file {path}: {e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise HybridError(f"{path}:{n}: not JSON ({e.msg}); write one JSON object per "
                              "line") from None
        if isinstance(item, str):
            prompts.append(item)
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(item["prompt"])
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(item["messages"])
        else:
            raise HybridError(f'{path}:{n}: a line is {{"prompt": "..."}}, {{"messages": '
                              '[...]}} or a JSON string')
    if not prompts:
        raise HybridError(f"{path} holds no prompts")
    return prompts


def profile_prompts(llm, prompts: list[Any], max_tokens: int, temperature: float = 0.7,
                    batch: int = 16, seed: int = 0,
                    progress: Callable[[int, int], None] | None = None) -> RoutingProfile:
    """Run `prompts` on `llm` (an LLM built with record_routing on) -> the routing profile."""
    from hybrid.engine.sampling.sampling_params import SamplingParams

    model = Path(llm.loaded.gguf.path).name
    RoutingProfile.of_engine(llm.engine, model)  # refuses an engine that does not record
    tok = llm.tokenizer
    room = llm.engine.scheduler.max_request_tokens
    max_tokens = max(1, min(max_tokens, room // 2))
    ids = []
    for p in prompts:
        encoded = tok.encode(p) if isinstance(p, str) else tok.encode_chat(p)
        ids.append(encoded[-(room - max_tokens):] if len(encoded) + max_tokens > room
                   else encoded)  # too long for the cache: keep the end
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        params = [SamplingParams(temperature=temperature, seed=seed + start + i,
                                 max_tokens=max_tokens) for i in range(len(chunk))]
        llm.generate(prompt_token_ids=chunk, sampling_params=params)
        if progress is not None:
            progress(start + len(chunk), len(ids))
    return RoutingProfile.of_engine(llm.engine, model)


def profile_on_fresh_engine(gguf_path: str, rules: str, prompts: list[Any], max_tokens: int,
                            cache_lens: int, device_map=None) -> RoutingProfile:
    """profile_prompts on an engine of its own (routing recorded, no prefix cache), its CPU
    pool closed after (benchmarks that profile, then measure on other engines)."""
    from hybrid.engine.config import EngineConfig
    from hybrid.tuning.measure import on_fresh_engine

    config = EngineConfig(record_routing=True, prefix_cache=False, cache_lens=cache_lens)
    return on_fresh_engine(gguf_path, rules, config,
                           lambda llm: profile_prompts(llm, prompts, max_tokens), device_map)
