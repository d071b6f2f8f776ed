"""Token slots grouped by expert: the order in which the MoE kernels visit (expert, token) pairs.

`route` runs inside the kernels (a counting sort, no Python per call); `group_by_expert` is its
plain numpy reference. Both order the slots by expert id, ties by slot index t*K + k. A negative
id is a slot served elsewhere (an expert the GPU holds): it is left out, so its expert's
weights are never read here.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def group_by_expert(topk_ids: np.ndarray, topk_weights: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(expert_ids [U], offsets [U+1], token_ids [N], weights [N]) with N the slots whose id
    is >= 0 (at most T*K).

    Slots offsets[u]:offsets[u+1] are the (token, weight) pairs routed to expert_ids[u].
    """
    flat = topk_ids.reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    order = order[flat[order] >= 0]
    expert_ids, counts = np.unique(flat[order], return_counts=True)
    offsets = np.zeros(expert_ids.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    token_ids = order // topk_ids.shape[1]
    weights = np.ascontiguousarray(topk_weights.reshape(-1)[order], dtype=np.float32)
    return expert_ids, offsets, token_ids, weights


@njit(cache=True)
def route(topk_ids: np.ndarray, topk_weights: np.ndarray, num_experts: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """group_by_expert in one pass of counts and one of placement.

    topk_ids: [T, K] int64 (each in [0, num_experts), or negative: skipped)
    topk_weights: [T, K] f32
    """
    num_tokens, top_k = topk_ids.shape
    counts = np.zeros(num_experts, np.int64)
    num_slots = 0
    for t in range(num_tokens):
        for k in range(top_k):
            e = topk_ids[t, k]
            if e >= 0:
                counts[e] += 1
                num_slots += 1
    num_used = 0
    for e in range(num_experts):
        num_used += counts[e] > 0
    expert_ids = np.empty(num_used, np.int64)
    offsets = np.empty(num_used + 1, np.int64)
    start = np.empty(num_experts, np.int64)  # next free slot of each expert
    u = 0
    offsets[0] = 0
    for e in range(num_experts):
        if counts[e] > 0:
            expert_ids[u] = e
            start[e] = offsets[u]
            offsets[u + 1] = offsets[u] + counts[e]
            u += 1
    token_ids = np.empty(num_slots, np.int64)
    weights = np.empty(num_slots, np.float32)
    for t in range(num_tokens):
        for k in range(top_k):
            e = topk_ids[t, k]
            if e < 0:
                continue
            token_ids[start[e]] = t
            weights[start[e]] = topk_weights[t, k]
            start[e] += 1
    return expert_ids, offsets, token_ids, weights
