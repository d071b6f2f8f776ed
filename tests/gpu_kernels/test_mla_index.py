"""DeepSeek-V3.2's sparse MLA decode on the paged caches (gpu_kernels/mla_index.py) against its
float64 references and the torch path's definition (hybrid/ops/mla_indexer.py): the indexer's
scores over scattered pages, the top-k slots, and attention over those keys alone, over many
shapes, lengths shorter and longer than top-k, and a padding row."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.mla_index import (
    index_scores_paged,
    index_scores_paged_ref,
    sparse_mla_decode,
    top_slots,
)
from hybrid.ops.mla_indexer import sparse_attention_ref
from tests.gpu_kernels.conftest import rel_err


def _paged(rng: torch.Generator, lens: list[int], page_size: int, dim: int, device):
    """Keys [slots, dim] bf16 of the sequences `lens` on shuffled pages; page_table [B, P]."""
    pages = [-(-n // page_size) for n in lens]
    width = max(max(pages), 1)
    order = torch.randperm(sum(pages) + 3, generator=rng)  # spare pages: others' rows
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    at = 0
    for i, p in enumerate(pages):
        table[i, :p] = order[at:at + p]
        at += p
    slots = (sum(pages) + 3) * page_size
    keys = torch.randn(slots, dim, generator=rng).to(torch.bfloat16)
    return keys.to(device), table.to(device), torch.tensor(lens, dtype=torch.int32).to(device)


@pytest.mark.parametrize("heads,dim,lens,page_size", [
    (16, 32, [1, 70, 129], 16),
    (64, 128, [200, 0, 64], 64),
    (32, 64, [257], 1),
    (16, 16, [5, 33], 4),
    (4, 32, [90, 3], 16),  # fewer heads than the kernel's block: zero-weight heads pad it
])
def test_index_scores_equal_the_reference(device, heads, dim, lens, page_size) -> None:
    rng = torch.Generator().manual_seed(heads + dim)
    keys, table, seq_lens = _paged(rng, lens, page_size, dim, device)
    q = torch.randn(len(lens), heads, dim, generator=rng).to(device)
    w = torch.randn(len(lens), heads, generator=rng).to(device)
    capacity = max(lens) + 37  # columns past every length: -inf
    got = index_scores_paged(q, w, keys, table, seq_lens, page_size, capacity).cpu()
    want = index_scores_paged_ref(q, w, keys, table, seq_lens, page_size, capacity)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    assert torch.allclose(got[finite].double(), want[finite], rtol=1e-4, atol=1e-5)


def test_index_scores_refuse_shapes_the_kernel_cannot_tile(device) -> None:
    rng = torch.Generator().manual_seed(0)
    keys, table, seq_lens = _paged(rng, [8], 4, 24, device)
    with pytest.raises(ValueError, match="powers of two"):
        index_scores_paged(torch.zeros(1, 16, 24, device=device), torch.zeros(1, 16, device=device),
                           keys, table, seq_lens, 4, 8)


def test_top_slots_are_the_best_positions_slots(device) -> None:
    rng = torch.Generator().manual_seed(3)
    keys, table, seq_lens = _paged(rng, [50, 3], 8, 16, device)
    scores = index_scores_paged(torch.randn(2, 16, 16, generator=rng).to(device),
                                torch.rand(2, 16, generator=rng).to(device), keys, table,
                                seq_lens, 8, 64)
    slots, counts = top_slots(scores, table, seq_lens, 8, topk=10)
    assert counts.tolist() == [10, 3]
    for i, n in enumerate([50, 3]):
        best = scores[i, :n].cpu().topk(min(10, n)).indices
        want = table[i, best // 8].long().cpu() * 8 + best % 8
        assert sorted(slots[i, :min(10, n)].cpu().tolist()) == sorted(want.tolist())


@pytest.mark.parametrize("lens,topk,page_size", [([40, 7, 90], 16, 16), ([300], 64, 64),
                                                 ([5, 0], 8, 4)])
def test_sparse_decode_attends_to_the_top_keys_alone(device, lens, topk, page_size) -> None:
    """The whole step against sparse_attention_ref (the torch path's definition): the same
    latent rows as the keys' pages, a query at each sequence's last position."""
    rng = torch.Generator().manual_seed(len(lens) + topk)
    heads, c, r, hi, d = 16, 64, 16, 16, 32
    index_keys, table, seq_lens = _paged(rng, lens, page_size, d, device)
    cache = torch.randn(index_keys.shape[0], c + r, generator=rng).to(torch.bfloat16).to(device)
    b = len(lens)
    q_lat = torch.randn(b, heads, c, generator=rng).to(device)
    q_rope = torch.randn(b, heads, r, generator=rng).to(device)
    iq = torch.randn(b, hi, d, generator=rng).to(device)
    iw = torch.randn(b, hi, generator=rng).to(device)
    scale = (c + r) ** -0.5
    got = sparse_mla_decode(q_lat, q_rope, cache, iq, iw, index_keys, table, seq_lens,
                            page_size, topk, max(lens) + 10, scale, num_splits=2).cpu()
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.count_nonzero(got[i]) == 0  # a padding row: zeros
            continue
        t = torch.arange(n)
        slots = table[i, t // page_size].long().cpu() * page_size + t % page_size
        scores = index_scores_paged_ref(iq[i:i + 1], iw[i:i + 1], index_keys, table[i:i + 1],
                                        seq_lens[i:i + 1], page_size, n)
        want = sparse_attention_ref(q_lat[i:i + 1].cpu(), q_rope[i:i + 1].cpu(),
                                    cache[slots].cpu(), scores, torch.ones(1, n, dtype=torch.bool),
                                    topk, scale)
        assert rel_err(got[i:i + 1], want) < 1e-4, (i, n)
