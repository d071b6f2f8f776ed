"""A model as the rules place it: the plan made and checked against the GPU's memory before
anything loads, then every operator built on its device (the loader, hybrid/model/, sits
below: it reads the file and builds the reference tree the rules rewrite)."""

from __future__ import annotations

from collections.abc import Callable

from hybrid.model.loader import LoadedModel
from hybrid.model.packed_cache import PackedCache
from hybrid.ops.compile_ahead import compile_ahead
from hybrid.rules.explain import refuse_if_over_budget
from hybrid.rules.inject import inject
from hybrid.rules.planner import plan_model
from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer


def load_with_rules(path: str, rules: str | None, device_map: dict[str, str] | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    cache_lens: int = 4096, packed_cache: bool = False) -> LoadedModel:
    """Plan the model with optimize rules, refuse a plan over a GPU's memory before touching
    it, then build it: operators on their devices. `packed_cache`: fast mode's packed experts
    persist on disk (hybrid.model.packed_cache) and later starts map them."""
    planned = plan_model(path, rules, device_map)
    refuse_if_over_budget(planned.plan, planned.spec, cache_lens)
    cache = None
    if packed_cache:
        cache = PackedCache.for_model(planned.gguf)
    compiling = compile_ahead(planned.plan, planned.gguf, planned.spec)
    try:
        model = inject(planned, progress, cache)
    except BaseException:  # a failed or interrupted load leaves no compiler running
        for job in compiling:
            job.stop()
        raise
    return LoadedModel(planned.spec, model, GGUFTokenizer(planned.gguf.metadata), planned.gguf,
                       compiling)
