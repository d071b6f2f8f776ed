"""Paged MLA prefill attention against its float64 reference: several chunks of one step with
cached prefixes of different lengths (one launch), head counts (V2-Lite 16, V3 128, a few),
pages shuffled, q_rope a strided view, rows outside the chunks untouched."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.mla_prefill import mla_prefill, mla_prefill_ref
from tests.gpu_kernels.conftest import rel_err

CASES = [  # heads, C, R, page size, spans as (q_len, kv_len)
    (16, 512, 64, 16, [(5, 40), (1, 1), (33, 33)]),
    (4, 64, 32, 8, [(70, 75), (3, 9)]),
    (128, 512, 64, 64, [(9, 130)]),
]


def _step(heads, c, r, page, spans, device, decodes: int = 2):
    """A step's rows: `decodes` rows first (left alone here), then the chunks."""
    g = torch.Generator().manual_seed(heads + len(spans))
    total_kv = sum(kv for _, kv in spans)
    n_pages = total_kv // page + len(spans) + 1
    cache = torch.randn(n_pages * page, c + r, generator=g).bfloat16().to(device)
    order = torch.randperm(n_pages, generator=g)
    meta, slots, row, at, used = [], [], decodes, 0, 0
    for q_len, kv_len in spans:
        pages = order[used:used + (kv_len + page - 1) // page]
        used += len(pages)
        t = torch.arange(kv_len)
        slots.append(pages[t // page] * page + t % page)
        meta.append([row, q_len, kv_len, at])
        row, at = row + q_len, at + kv_len
    n = row
    q = (torch.randn(n, heads, c, generator=g) * 0.1).to(device)
    qr = (torch.randn(n, heads, 8 + r, generator=g) * 0.1).to(device)[..., 8:]
    meta_t = torch.tensor(meta, dtype=torch.int64, device=device)
    return q, qr, cache, meta_t, torch.cat(slots).to(device)


@pytest.mark.parametrize("heads,c,r,page,spans", CASES)
def test_mla_prefill(heads, c, r, page, spans, device) -> None:
    q, qr, cache, meta, slots = _step(heads, c, r, page, spans, device)
    out = torch.full_like(q, 7.0)
    mla_prefill(q, qr, cache, meta, slots, 0.07, max(s[0] for s in spans), out)
    ref = mla_prefill_ref(q, qr, cache, meta, slots, 0.07, torch.full_like(q, 7.0))
    assert torch.isfinite(out).all()
    assert (out[:2] == 7.0).all()  # the decode rows are not the kernel's
    assert rel_err(out[2:], ref[2:]) < 3e-3  # tf32 products


def test_matches_the_engines_torch_path(device) -> None:
    """The same numbers as mla_torch.attend, which the CPU path runs per chunk."""
    from hybrid.ops.mla_torch import attend, causal_mask

    q, qr, cache, meta, slots = _step(16, 512, 64, 16, [(6, 20)], device, decodes=0)
    out = mla_prefill(q, qr, cache, meta, slots, 0.1, 6, torch.empty_like(q))
    kv = cache[slots].float()
    want = attend(q, qr, kv, causal_mask(6, 20, q.device), 0.1)
    assert rel_err(out, want) < 3e-3


def test_no_spans_and_bad_cache(device) -> None:
    q, qr, cache, meta, slots = _step(4, 64, 32, 8, [(2, 2)], device)
    out = torch.zeros_like(q)
    assert mla_prefill(q, qr, cache, meta[:0], slots, 0.1, 0, out) is out
    assert (out == 0).all()
    with pytest.raises(ValueError, match="cache rows"):
        mla_prefill(q, qr, cache[:, :80], meta, slots, 0.1, 2, out)
