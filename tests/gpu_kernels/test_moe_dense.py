"""Routed experts on weights dequantized once into fp16 (gpu_kernels/moe_dense.py) against the
float64 reference: types, skewed routing, left-out experts (the fused gate_up layout: test_moe_grouped.py); and the
fp16 rows equal the reference dequantization rounded to fp16."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.moe_dense import dense_rows, moe_experts_dense
from gpu_kernels.moe_grouped import moe_experts_ref
from tests.gpu_kernels.conftest import rel_err
from tests.gpu_kernels.test_moe_grouped import INTER, H, routing, stacked


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS, Q.MXFP4],
                         ids=lambda q: q.name)
def test_dense_rows_are_the_dequantized_rows_in_fp16(qtype: Q, device: torch.device) -> None:
    w = stacked(qtype, 2, 32, H, 7, device)
    assert torch.equal(dense_rows(w).cpu(), dequantize(w).to(torch.float16).cpu())


@pytest.mark.parametrize("gate_type,down_type,n,skew", [(Q.Q4_K, Q.Q8_0, 40, False),
                                                        (Q.Q5_0, Q.Q6_K, 150, True),
                                                        (Q.MXFP4, Q.MXFP4, 9, False)],
                         ids=lambda v: v.name if isinstance(v, Q) else str(v))
def test_matches_reference(gate_type: Q, down_type: Q, n: int, skew: bool,
                           device: torch.device) -> None:
    """fp16 x, h and weights: within fast mode's fp16 rounding of the float64 result."""
    experts, k = 4, 2
    gate = stacked(gate_type, experts, INTER, H, 1, device)
    up = stacked(gate_type, experts, INTER, H, 2, device)
    down = stacked(down_type, experts, H, INTER, 3, device)
    ids, w = routing(n, k, experts, seed=n, skew=skew)
    ids[::5, 1] = -1  # held elsewhere: adds nothing
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(5))
    ids, w, x = ids.to(device), w.to(device), x.to(device)
    y = moe_experts_dense(x, ids, w, (gate, up), down, experts)
    assert 1e-5 < rel_err(y, moe_experts_ref(x, ids, w, gate, up, down, experts)) < 2e-3

