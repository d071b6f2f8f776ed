"""The experts' activation, one element at a time, for every kernel family (exact, packed
VNNI, AMX): SwiGLU, clamped where the model says so.

    weighted_swiglu(w, g, u, limit) = w * silu(min(g, limit)) * clamp(u, -limit, limit)

(w: the routing weight, which scales h: down is linear, so w * down(h) = down(w * h)).

DeepSeek-V4 clamps at `swiglu_limit` (transformers' DeepseekV4Experts, llama.cpp's
`swiglu_clamp_exp`); every other family passes limit = inf, where the clamps change no bit.
g, u and limit are float32 (a float64 limit would widen the whole expression). The float64
reference is formats/reference.swiglu_ref.
"""

from __future__ import annotations

import numpy as np
from numba import njit

f32 = np.float32


@njit(inline="always", cache=True)
def weighted_swiglu(w, g, u, limit):
    g = min(g, limit)
    u = max(min(u, limit), -limit)
    return w * u * g / (f32(1.0) + np.exp(-g))
