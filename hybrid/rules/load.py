"""A model as the rules place it: the plan made and checked against the GPU's memory before
anything loads, then every operator built on its device (the loader, hybrid/model/, sits
below: it reads the file and builds the reference tree the rules rewrite)."""

from __future__ import annotations

from collections.abc import Callable

from hybrid.model.loader import LoadedModel, open_model
from hybrid.model.packed_cache import PackedCache
from hybrid.ops.compile_ahead import compile_ahead, packers_ahead, packs_any
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
    opened = open_model(path)
    packers = packers_ahead(opened[0])
    compiling = []
    try:
        planned = plan_model(path, rules, device_map, opened=opened)
        if packers is not None and not packs_any(planned.plan):
            packers.stop()
            packers = None
        refuse_if_over_budget(planned.plan, planned.spec, cache_lens)
        cache = None
        if packed_cache:
            cache = PackedCache.for_model(planned.gguf)
        compiling = compile_ahead(planned.plan, planned.gguf, planned.spec)
        model = inject(planned, progress, cache, packers)
        if packers is not None:  # reaped (nothing packed where the packed cache had it all)
            packers.wait()
    except BaseException:  # a failed or interrupted load leaves no compiler running
        for job in [*compiling, *([packers] if packers is not None else [])]:
            job.stop()
        raise
    return LoadedModel(planned.spec, model, GGUFTokenizer(planned.gguf.metadata), planned.gguf,
                       compiling)
