"""Expanded-form MLA prefill attention (per-head keys and values) against its float64
reference: several spans with cached prefixes of different lengths in one launch, head counts
and dims (DeepSeek's 128/64/128, small ones), strided operands, rows outside the spans
untouched; and the expanded form equal to the absorbed one on the same latents."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.mla_prefill import mla_prefill_ref
from gpu_kernels.mla_prefill_expanded import mla_prefill_expanded, mla_prefill_expanded_ref
from tests.gpu_kernels.conftest import rel_err

CASES = [  # heads, nope, rope, v, spans as (q_len, kv_len)
    (16, 128, 64, 128, [(5, 40), (1, 1), (70, 70)]),
    (2, 32, 32, 32, [(100, 130), (3, 9)]),
    (8, 128, 64, 128, [(33, 97)]),
]


def _step(heads, nope, r, dv, spans, device, decodes: int = 2):
    """A step's rows (`decodes` rows first, left alone), then the spans; their keys in order."""
    g = torch.Generator().manual_seed(heads + len(spans))
    meta, row, at = [], decodes, 0
    for q_len, kv_len in spans:
        meta.append([row, q_len, kv_len, at])
        row, at = row + q_len, at + kv_len
    q = (torch.randn(row, heads, nope + r, generator=g) * 0.1).to(device)
    kv = torch.randn(at, heads, nope + 8 + dv, generator=g).to(device)  # strided views
    k_rope = torch.randn(at, r, generator=g).bfloat16().to(device)  # as the cache holds it
    meta_t = torch.tensor(meta, dtype=torch.int64, device=device)
    return q, kv[..., :nope], k_rope, kv[..., nope + 8:], meta_t


@pytest.mark.parametrize("precision", ["fp16", "tf32"])
@pytest.mark.parametrize("heads,nope,r,dv,spans", CASES)
def test_matches_reference(heads, nope, r, dv, spans, precision, device) -> None:
    q, kn, kr, v, meta = _step(heads, nope, r, dv, spans, device)
    out = torch.full((q.shape[0], heads, dv), 7.0, device=device)
    mla_prefill_expanded(q, kn, kr, v, meta, 0.08, max(s[0] for s in spans), out, precision)
    ref = mla_prefill_expanded_ref(q, kn, kr, v, meta, 0.08, out.clone())
    assert torch.isfinite(out).all()
    assert (out[:2] == 7.0).all()  # the decode rows are not the kernel's
    assert rel_err(out[2:], ref[2:]) < 3e-3  # products on 10-bit mantissas


def test_fp16_operands_and_other_tiles(device) -> None:
    """Keys and values already in fp16 give what their fp32 originals do (the kernel rounds
    to fp16 itself); other tiles round the softmax weights against other running maxima; tf32
    products take fp16 keys and values as well."""
    heads, nope, r, dv, spans = 4, 32, 16, 32, [(40, 75), (9, 9)]
    q, kn, kr, v, meta = _step(heads, nope, r, dv, spans, device)
    kn16, v16 = kn.half(), v.half()
    a = mla_prefill_expanded(q, kn, kr, v, meta, 0.1, 40, torch.zeros(q.shape[0], heads, dv,
                                                                      device=device))
    for tiles in [None, (16, 32, 4, 1), (32, 16, 2, 2)]:
        b = mla_prefill_expanded(q, kn16, kr, v16, meta, 0.1, 40,
                                 torch.zeros(q.shape[0], heads, dv, device=device), tiles=tiles)
        assert rel_err(b[2:], a[2:]) < (1e-6 if tiles is None else 3e-4), tiles
    c = mla_prefill_expanded(q, kn16, kr, v16, meta, 0.1, 40,  # tf32 reads fp16 keys too
                             torch.zeros(q.shape[0], heads, dv, device=device), "tf32")
    assert rel_err(c[2:], a[2:]) < 3e-3


def test_bad_precision(device) -> None:
    q, kn, kr, v, meta = _step(2, 32, 32, 32, [(2, 2)], device)
    with pytest.raises(ValueError, match="precision 'bf16'"):
        mla_prefill_expanded(q, kn, kr, v, meta, 0.1, 2, torch.zeros(q.shape[0], 2, 32,
                                                                     device=device), "bf16")


def test_expanded_equals_absorbed() -> None:
    """k_nope = W_UK c, v = W_UV c: the expanded references give what the absorbed one does
    on the latents c (float64 throughout, so equal to rounding)."""
    heads, c, nope, r, dv = 4, 64, 32, 32, 32
    g = torch.Generator().manual_seed(3)
    spans = [(6, 20), (4, 4)]
    meta, row, at = [], 0, 0
    for q_len, kv_len in spans:
        meta.append([row, q_len, kv_len, at])
        row, at = row + q_len, at + kv_len
    meta = torch.tensor(meta)
    cache = torch.randn(at, c + r, generator=g).double()
    w_kv = torch.randn(heads, nope + dv, c, generator=g).double() * 0.1  # kv_b per head
    q = torch.randn(row, heads, nope + r, generator=g).double() * 0.1
    kv = torch.einsum("sc,hdc->shd", cache[:, :c], w_kv)  # [S, h, nope + v]
    out = mla_prefill_expanded_ref(q, kv[..., :nope], cache[:, c:], kv[..., nope:], meta, 0.1,
                                   torch.zeros(row, heads, dv, dtype=torch.float64))
    q_lat = torch.einsum("nhk,hkc->nhc", q[..., :nope], w_kv[:, :nope])  # absorbed queries
    o_lat = mla_prefill_ref(q_lat, q[..., nope:], cache, meta, torch.arange(at), 0.1,
                            torch.zeros(row, heads, c, dtype=torch.float64))
    absorbed = torch.einsum("nhc,hvc->nhv", o_lat.double(), w_kv[:, nope:])
    assert rel_err(out, absorbed) < 1e-6


def test_no_spans_and_bad_dims(device) -> None:
    q, kn, kr, v, meta = _step(2, 32, 32, 32, [(2, 2)], device)
    out = torch.zeros(q.shape[0], 2, 32, device=device)
    assert mla_prefill_expanded(q, kn, kr, v, meta[:0], 0.1, 0, out) is out
    assert (out == 0).all()
    with pytest.raises(ValueError, match="powers of two"):
        mla_prefill_expanded(q[..., :60], kn[..., :28], kr, v, meta, 0.1, 2, out)
