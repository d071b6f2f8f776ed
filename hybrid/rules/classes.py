"""Module class names a rule's `match.class` may use without a dotted path."""

from __future__ import annotations

import inspect
from functools import lru_cache

from torch import nn


@lru_cache(maxsize=1)
def known_class_names() -> frozenset[str]:
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as v2
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32

    names = {n for mod in (v2, v3, v32, v4) for n, obj in vars(mod).items()
             if inspect.isclass(obj) and issubclass(obj, nn.Module)}
    names.update(n for n, obj in vars(nn).items() if inspect.isclass(obj) and issubclass(obj, nn.Module))
    return frozenset(names)
