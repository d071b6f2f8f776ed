"""DeepSeek-V3.2's lightning indexer and sparse attention in torch (hybrid/ops/mla_indexer.py)
against their float64 references and transformers' DeepseekV32Indexer, on random tensors over
several shapes, top-k below and above the number of keys."""

from __future__ import annotations

import pytest
import torch

from hybrid.ops.mla_indexer import (
    index_keys,
    index_scores,
    index_scores_ref,
    rotate_halves,
    sparse_attend,
    sparse_attention_ref,
    top_k_keys,
)
from hybrid.ops.mla_torch import causal_mask


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("t,s,heads,dim", [(1, 1, 1, 8), (1, 37, 4, 64), (5, 5, 2, 32),
                                           (7, 20, 8, 16)])
def test_scores_match_the_reference(t: int, s: int, heads: int, dim: int) -> None:
    q, w, keys = randn(t, heads, dim, seed=t), randn(t, heads, seed=s), randn(s, dim, seed=dim)
    ours = index_scores(q, w, keys)  # [t, S]
    ref = index_scores_ref(q, w, keys)
    assert ours.shape == (t, s) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t,s,topk", [(1, 9, 4), (1, 3, 8), (6, 6, 2), (4, 30, 8), (4, 30, 64),
                                      (12, 12, 12)])
@pytest.mark.parametrize("seed", [0, 1])
def test_sparse_attention_matches_the_reference(t: int, s: int, topk: int, seed: int) -> None:
    """A chunk of t queries, the last t of s positions, each over its own top-k keys."""
    heads, c, r = 3, 16, 8
    q_lat, q_rope = randn(t, heads, c, seed=seed), randn(t, heads, r, seed=seed + 1)
    kv = randn(s, c + r, seed=seed + 2)
    scores = randn(t, s, seed=seed + 3)
    allowed = causal_mask(t, s, torch.device("cpu"))
    ids, keep = top_k_keys(scores, allowed, topk)
    assert ids.shape == (t, min(topk, s))
    assert torch.equal(keep.sum(-1), torch.clamp(allowed.sum(-1), max=topk))
    ours = sparse_attend(q_lat, q_rope, kv, ids, keep, 0.3)  # [t, h, c]
    ref = sparse_attention_ref(q_lat, q_rope, kv, scores, allowed, topk, 0.3)
    torch.testing.assert_close(ours.double(), ref, atol=1e-5, rtol=1e-5)
    if topk >= s:  # every visible key chosen: dense causal attention
        from hybrid.ops.mla_torch import attend

        dense = attend(q_lat, q_rope, kv, allowed, 0.3)
        torch.testing.assert_close(ours, dense, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("t,topk", [(6, 8), (19, 8), (33, 4), (16, 64)])
def test_selection_matches_transformers_indexer(t: int, topk: int) -> None:
    """Our queries, keys, weights and top-k pick keys of the same scores as transformers'
    DeepseekV32Indexer (ties at equal scores may pick either: compare the chosen scores)."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        DeepseekV32Indexer,
        DeepseekV32RotaryEmbedding,
    )

    config = DeepseekV32Config(hidden_size=48, q_lora_rank=24, qk_rope_head_dim=16,
                               qk_nope_head_dim=16, index_n_heads=4, index_head_dim=32,
                               index_topk=topk, num_attention_heads=2, num_hidden_layers=1)
    torch.manual_seed(t)
    indexer = DeepseekV32Indexer(config, 0).eval()
    with torch.no_grad():
        for p in indexer.parameters():
            p.normal_(0.0, 0.3)
    x, q_a = randn(1, t, 48, seed=t), randn(1, t, 24, seed=t + 1)  # [1, T, H], [1, T, q_lora]
    positions = torch.arange(t)[None]
    cos, sin = DeepseekV32RotaryEmbedding(config)(x, positions)  # [1, T, rope]
    allowed = causal_mask(t, t, torch.device("cpu"))  # [T, T]
    with torch.no_grad():
        theirs = indexer(x, q_a, (cos, sin), allowed[None], positions).long()[0]  # [T, K]
        half = config.qk_rope_head_dim // 2
        c, s = cos[0, :, :half], sin[0, :, :half]  # [T, rope / 2]
        iq = rotate_halves((q_a[0] @ indexer.wq_b.weight.T).view(t, 4, 32), c, s)
        ik = index_keys(x[0] @ indexer.wk.weight.T, indexer.k_norm.weight, indexer.k_norm.bias,
                        c, s)  # [T, D]
        iw = x[0] @ indexer.weights_proj.weight.T  # [T, Hi]
        scores = index_scores(iq, iw, ik)  # [T, T]
    ids, keep = top_k_keys(scores, allowed, topk)
    assert ids.shape == theirs.shape
    for row in range(t):
        ours_row = sorted(scores[row, ids[row][keep[row]]].tolist())
        their_keep = allowed[row, theirs[row]]
        their_row = sorted(scores[row, theirs[row][their_keep]].tolist())
        assert ours_row == pytest.approx(their_row, abs=1e-6), row
