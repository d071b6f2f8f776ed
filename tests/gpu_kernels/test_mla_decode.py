"""Paged MLA decode attention against its float64 reference: mixed lengths (padding rows of
length 0 included), page sizes, head counts (V2-Lite 16, V3 128), split counts; q_rope a
strided view."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.mla_decode import choose_splits, mla_decode, mla_decode_ref
from tests.gpu_kernels.conftest import rel_err

CASES = [  # heads, C, R, page size, lengths
    (16, 512, 64, 16, [5, 40, 0]),
    (20, 64, 32, 8, [70, 1]),
    (128, 512, 64, 64, [130]),
]


@pytest.mark.parametrize("heads,c,r,page,lens", CASES)
@pytest.mark.parametrize("splits", [1, 3, None])
def test_mla_decode(heads, c, r, page, lens, splits, device) -> None:
    g = torch.Generator().manual_seed(heads + len(lens))
    b, pages = len(lens), 12
    cache = torch.randn(page * (pages * b + 1), c + r, generator=g).bfloat16().to(device)
    table = torch.randperm(pages * b + 1, generator=g)[: b * pages].reshape(b, pages)
    table = table.int().to(device)
    q = (torch.randn(b, heads, c, generator=g) * 0.1).to(device)
    # q_rope as the engine passes it: the rope columns of the queries [B, H, nope + R]
    qr = (torch.randn(b, heads, 8 + r, generator=g) * 0.1).to(device)[..., 8:]
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    n = splits or choose_splits(b, heads, max(lens))
    out = mla_decode(q, qr, cache, table, seq, page, 0.07, n)
    ref = mla_decode_ref(q, qr, cache, table, seq, page, 0.07)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 3e-5  # bf16x2 products on the bf16 cache
    for i, length in enumerate(lens):
        if length == 0:
            assert (out[i] == 0).all()


@pytest.mark.parametrize("lens", [[5, 40, 0, 130], [1, 33]])
def test_splits_past_the_length_are_not_merged(lens, device, monkeypatch) -> None:
    """A captured graph's split count (sized for the longest sequence the cache holds) on
    short sequences: the splits their lengths do not fill store nothing and are not merged, so
    the partial results' memory may hold anything (NaN here)."""
    g = torch.Generator().manual_seed(len(lens))
    heads, c, r, page, b, pages = 16, 512, 64, 16, len(lens), 10
    cache = torch.randn(page * (pages * b + 1), c + r, generator=g).bfloat16().to(device)
    table = torch.randperm(pages * b, generator=g).reshape(b, pages).int().to(device)
    q = (torch.randn(b, heads, c, generator=g) * 0.1).to(device)
    qr = (torch.randn(b, heads, r, generator=g) * 0.1).to(device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    empty = torch.empty

    def nan_empty(*shape, dtype=None, device=None):
        return empty(*shape, dtype=dtype, device=device).fill_(float("nan"))

    out = torch.zeros(b, heads, c, device=device)
    monkeypatch.setattr(torch, "empty", nan_empty)
    mla_decode(q, qr, cache, table, seq, page, 0.07, 64, out=out)
    monkeypatch.undo()
    assert torch.isfinite(out).all()
    assert rel_err(out, mla_decode_ref(q, qr, cache, table, seq, page, 0.07)) < 3e-5
    for i, length in enumerate(lens):
        if length == 0:
            assert (out[i] == 0).all()


def test_splits_fill_the_gpu() -> None:
    assert choose_splits(1, 16, 4096) == 64  # 1 x 1 head blocks: 2 x 132 SMs, at most 64
    assert choose_splits(1, 16, 10) == 1  # never more splits than token blocks
    assert choose_splits(64, 128, 4096) == 2  # 64 x 4 blocks of 32 heads: twice 132 SMs


@pytest.mark.parametrize("precision", ["tf32", "bf16x2"])
@pytest.mark.parametrize("tiles", [(16, 16, 8), (16, 64, 8), (32, 64, 8), (32, 32, 4)])
def test_mla_decode_any_tiles(tiles, precision, device) -> None:
    """Every tile choice and product precision the sweep tries computes the same attention
    (the defaults come from decode_tiles); bf16x2 (queries and probabilities each as two bf16,
    the bf16 cache as it is) to ~1e-5."""
    bh, bs, warps = tiles
    g = torch.Generator().manual_seed(bh + bs)
    heads, c, r, page, lens = 40, 64, 32, 16, [100, 3, 0, 33]
    b, pages = len(lens), 8
    cache = torch.randn(page * (pages * b + 1), c + r, generator=g).bfloat16().to(device)
    table = torch.randperm(pages * b, generator=g).reshape(b, pages).int().to(device)
    q = (torch.randn(b, heads, c, generator=g) * 0.1).to(device)
    qr = (torch.randn(b, heads, r, generator=g) * 0.1).to(device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    out = mla_decode(q, qr, cache, table, seq, page, 0.07, 3, block_tokens=bs,
                     heads_per_program=bh, num_warps=warps, precision=precision)
    err = rel_err(out, mla_decode_ref(q, qr, cache, table, seq, page, 0.07))
    assert err < (3e-3 if precision == "tf32" else 3e-5)
    assert (out[2] == 0).all()
