"""The Q6_K integer-activation decode product against its float64 reference over tiles, groups
and every code (its shapes and bits are test_qdot_i8.py's, which runs both types)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from gpu_kernels.qdot_i8 import quantize_x
from gpu_kernels.qdot_i8_q6k import Q6K_TILES, qmatmul_i8_q6k, qmatmul_i8_q6k_ref
from tests.gpu_kernels.conftest import rel_err
from tests.gpu_kernels.test_qdot_i8 import KERNEL_TOL
from tests.gpu_kernels.test_qmatmul import weight


@pytest.mark.parametrize("tiles", [Q6K_TILES, (1, 1, 1), (2, 4, 1), (16, 2, 4), (8, 8, 2)])
def test_tiles(tiles: tuple[int, int, int], device: torch.device) -> None:
    """Any tile gives the same result; rows that do not fill a program are masked."""
    w = weight(Q.Q6_K, 19, 1024, seed=5, device=device)
    xq = quantize_x(torch.randn(1, 1024).to(device))
    assert rel_err(qmatmul_i8_q6k(xq, w, tiles=tiles), qmatmul_i8_q6k_ref(xq, w)[:, 0]) \
        < KERNEL_TOL


def test_groups_and_row_offsets(device: torch.device) -> None:
    """MLA's per-head form: x [M, G, K], group g reading rows row0 + g * gstride + [0, n)."""
    w = weight(Q.Q6_K, 4 * 24, 512, seed=7, device=device)
    x = torch.randn(2, 4, 512, generator=torch.Generator().manual_seed(3)).to(device)
    xq = quantize_x(x)
    y = qmatmul_i8_q6k(xq, w, out_rows=8, row0=16, gstride=24, groups=4)
    assert y.shape == (2, 4, 8)
    assert rel_err(y, qmatmul_i8_q6k_ref(xq, w, 8, 16, 24, 4)) < KERNEL_TOL


def test_every_code_and_its_extremes(device: torch.device) -> None:
    """Rows whose 6-bit codes run over all 64 values (ql's nibbles and qh's pairs in every
    combination, so each byte's offset meets 0 and 63) and x at both ends of its codes."""
    w = weight(Q.Q6_K, 4, 256, seed=11, device=device)
    ql, qh = w.planes[:2]
    ql.copy_((torch.arange(ql.numel(), device=ql.device) * 37 % 256).reshape(ql.shape))
    qh.copy_((torch.arange(qh.numel(), device=qh.device) * 101 % 256).reshape(qh.shape))
    x = torch.where(torch.arange(256) % 3 == 0, 1.0, -1.0)[None, :].to(device)
    xq = quantize_x(x)
    assert rel_err(qmatmul_i8_q6k(xq, w), qmatmul_i8_q6k_ref(xq, w)[:, 0]) < KERNEL_TOL


def test_refuses_other_types(device: torch.device) -> None:
    w = weight(Q.Q4_K, 4, 256, seed=1, device=device)
    with pytest.raises(ValueError, match="Q6_K"):
        qmatmul_i8_q6k(quantize_x(torch.randn(1, 256).to(device)), w)
