"""Quantized products against their float64 reference, over every type, token counts on both
sides of the tensor-core threshold, per-head groups and the transposed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from cpu_kernels.formats.random_blocks import random_rows
from gpu_kernels.dequant_tile import embedding, embedding_ref
from gpu_kernels.qformat import to_planes
from gpu_kernels.qmatmul import DOT_MIN_TOKENS, qmatmul, qmatmul_ref, qmatmul_t, qmatmul_t_ref
from tests.gpu_kernels.conftest import rel_err

TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
         Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4,
         Q.F16, Q.BF16, Q.F32]
FP32_TOL = 1e-5  # fp32 products, k-order sums
TF32_TOL = 2e-5  # tensor cores, tf32x3


def weight(qtype: Q, rows: int, cols: int, seed: int, device: torch.device):
    raw = random_rows(np.random.default_rng(seed), int(qtype), rows, cols, 0.02)
    return to_planes(torch.from_numpy(raw.copy()), int(qtype), rows, cols).to(device)


def tol(m: int) -> float:
    return FP32_TOL if m < DOT_MIN_TOKENS else TF32_TOL


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 8, 12])
def test_qmatmul(qtype: Q, m: int, device: torch.device) -> None:
    w = weight(qtype, 37, 512, seed=m, device=device)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).to(device)
    y = torch.full((m, 37), float("nan"), device=device)
    qmatmul(x, w, out=y)
    assert rel_err(y, qmatmul_ref(x, w)) < tol(m)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.Q6_K, Q.MXFP4, Q.BF16],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 2, 16])
def test_grouped_and_transposed(qtype: Q, m: int, device: torch.device) -> None:
    """MLA's per-head products: head g reads rows row0 + g * gstride + [0, n)."""
    heads, nope, v, c = 3, 32, 24, 256
    w = weight(qtype, heads * (nope + v), c, seed=7, device=device)  # a legacy kv_b
    q_nope = torch.randn(m, heads, nope).to(device)
    q_lat = qmatmul_t(q_nope, w, in_rows=nope, row0=0, gstride=nope + v)  # [m, heads, c]
    assert rel_err(q_lat, qmatmul_t_ref(q_nope, w, nope, 0, nope + v)) < tol(m)
    o_lat = torch.randn(m, heads, c).to(device)
    o = qmatmul(o_lat, w, out_rows=v, row0=nope, gstride=nope + v)  # [m, heads, v]
    assert o.shape == (m, heads, v)
    assert rel_err(o, qmatmul_ref(o_lat, w, v, nope, nope + v)) < tol(m)


@pytest.mark.parametrize("rows,cols,m", [(5, 32, 1), (19, 96, 2), (33, 320, 12), (9, 1024, 3)])
def test_mxfp4_shapes(rows: int, cols: int, m: int, device: torch.device) -> None:
    """Rows of 1, 3, 10 and 32 blocks (steps of one chunk, of two and more), fp32 and
    tensor-core products."""
    w = weight(Q.MXFP4, rows, cols, seed=cols, device=device)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(rows)).to(device)
    assert rel_err(qmatmul(x, w), qmatmul_ref(x, w)) < tol(m)


def test_large_k_and_rows(device: torch.device) -> None:
    w = weight(Q.Q4_K, 70, 2048, seed=3, device=device)
    x = torch.randn(2, 2048).to(device)
    assert rel_err(qmatmul(x, w), qmatmul_ref(x, w)) < FP32_TOL


def test_bad_width(device: torch.device) -> None:
    w = weight(Q.Q8_0, 4, 64, seed=0, device=device)
    with pytest.raises(ValueError, match="features"):
        qmatmul(torch.randn(1, 32, device=device), w)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.MXFP4, Q.F32], ids=lambda t: t.name)
def test_embedding(qtype: Q, device: torch.device) -> None:
    w = weight(qtype, 50, 256, seed=5, device=device)
    ids = torch.tensor([3, 49, 0, 3, 17], device=device)
    got = embedding(ids, w)
    torch.testing.assert_close(got.cpu(), embedding_ref(ids, w).cpu(), rtol=0, atol=0)
