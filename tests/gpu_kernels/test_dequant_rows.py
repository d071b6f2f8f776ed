"""Rows dequantized whole (the scratch of qmatmul's long-prompt path) equal the reference
dequantization element for element, and qmatmul through the scratch matches its float64
reference, for one and many groups, in one round and in several, in fp32 and with fp16
operands (rows of any magnitude scaled into fp16's range)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from gpu_kernels import dequant_rows as dr
from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.qmatmul import qmatmul, qmatmul_ref
from tests.gpu_kernels.conftest import rel_err
from tests.gpu_kernels.test_qmatmul import TYPES, weight


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_rows_equal_the_reference(qtype: Q, device: torch.device) -> None:
    w = weight(qtype, 40, 256, seed=3, device=device)
    ref = dequantize(w).cpu()  # [40, 256]
    got = dr.dequant_rows(w, 5, row0=2, gstride=12, groups=3).cpu()  # [3, 5, 256]
    for g in range(3):
        assert torch.equal(got[g], ref[2 + 12 * g:7 + 12 * g])


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("rounds", ["one", "several"])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_qmatmul_through_the_scratch(qtype: Q, rounds: str, fp16: bool, device: torch.device,
                                     monkeypatch) -> None:
    if rounds == "several":  # 16 rows a round, or one group a round
        monkeypatch.setattr(dr, "SCRATCH_BYTES", 16 * 4 * 256)
    m = dr.SCRATCH_MIN_TOKENS
    w = replace(weight(qtype, 70, 256, seed=5, device=device), fp16_prompts=fp16)
    tol = 2e-3 if fp16 else 1e-5  # fp16: 11 significant bits per operand, fp32 sums
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m, 256, generator=gen) * torch.logspace(-6, 6, m)[:, None]  # [M, 256]
    x[3] = 0.0
    x = x.to(device)
    y = torch.full((m, 70), float("nan"), device=device)
    qmatmul(x, w, out=y)
    ref = qmatmul_ref(x, w)
    assert torch.isfinite(y).all() and (y[3] == 0).all()
    assert all(rel_err(y[i], ref[i]) < tol for i in range(0, m, 17))  # every magnitude
    xg = torch.randn(m, 3, 256, generator=gen).to(device)  # per-head groups: rows 4 + 20g
    yg = qmatmul(xg, w, out_rows=16, row0=4, gstride=20)
    assert rel_err(yg, qmatmul_ref(xg, w, out_rows=16, row0=4, gstride=20)) < tol


def test_fp16_rows_scale_by_powers_of_two() -> None:
    x = torch.tensor([[[3e6, -1.0, 0.5]], [[1e-30, 0.0, 0.0]], [[0.0, 0.0, 0.0]]])  # [3, 1, 3]
    x16, scale = dr.fp16_rows(x)
    assert x16.dtype == torch.float16 and torch.isfinite(x16).all()
    assert (torch.log2(scale) == torch.log2(scale).round()).all()
    top = x16.float().abs().amax(-1)  # [3, 1]
    assert ((top[:2] > 2 ** 13) & (top[:2] <= 2 ** 14)).all() and top[2] == 0
    assert torch.equal(x16.float() * scale, x16.float().double().mul(scale.double()).float())
    assert rel_err(x16.float() * scale, x) < 1e-3
