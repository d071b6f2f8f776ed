"""Rows dequantized whole (the scratch of qmatmul's long-prompt path) equal the reference
dequantization element for element, and qmatmul through the scratch matches its float64
reference, for one and many groups, in one round and in several."""

from __future__ import annotations

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
def test_qmatmul_through_the_scratch(qtype: Q, rounds: str, device: torch.device,
                                     monkeypatch) -> None:
    if rounds == "several":  # 16 rows a round, or one group a round
        monkeypatch.setattr(dr, "SCRATCH_BYTES", 16 * 4 * 256)
    m = dr.SCRATCH_MIN_TOKENS
    w = weight(qtype, 70, 256, seed=5, device=device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(m, 256, generator=gen).to(device)
    y = torch.full((m, 70), float("nan"), device=device)
    qmatmul(x, w, out=y)
    assert rel_err(y, qmatmul_ref(x, w)) < 1e-5
    xg = torch.randn(m, 3, 256, generator=gen).to(device)  # per-head groups: rows 4 + 20g
    yg = qmatmul(xg, w, out_rows=16, row0=4, gstride=20)
    assert rel_err(yg, qmatmul_ref(xg, w, out_rows=16, row0=4, gstride=20)) < 1e-5
