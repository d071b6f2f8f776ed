"""The K-quant transposed decode products (Q4_K, Q6_K) against qmatmul_t's float64 reference:
legacy kv_b shapes (heads of nope key rows then value rows), token blocks, tiles, rows not
filling a step."""

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from gpu_kernels.qmatmul import FEW_GROUPS, qmatmul_t, qmatmul_t_ref
from gpu_kernels.qmatmul_t_kquant import TILES, qmatmul_t_kquant, takes
from tests.gpu_kernels.conftest import rel_err
from tests.gpu_kernels.test_qmatmul import FP32_TOL, weight


@pytest.mark.parametrize("heads,nope,v,cols", [(1, 32, 0, 256), (3, 40, 24, 512),
                                               (4, 128, 128, 512), (2, 17, 5, 768)])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_legacy_kv_b_absorption(qtype, heads, nope, v, cols, m, device) -> None:
    w = weight(qtype, heads * (nope + v), cols, seed=heads + m, device=device)
    x = torch.randn(m, heads, nope, generator=torch.Generator().manual_seed(m)).to(device)
    y = torch.full((m, heads, cols), float("nan"), device=device)
    qmatmul_t_kquant(x, w, nope, 0, nope + v, y)
    assert rel_err(y, qmatmul_t_ref(x, w, nope, 0, nope + v)) < FP32_TOL


@pytest.mark.parametrize("tiles", [(32, 1, 4), (16, 2, 2), (8, 4, 1), (64, 1, 8)])
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_any_tiles_and_row0(qtype, tiles, device) -> None:
    """The value half's rows (row0 = nope) through other tiles: rows past a step masked."""
    heads, nope, v, cols = 3, 24, 40, 512
    w = weight(qtype, heads * (nope + v), cols, seed=11, device=device)
    x = torch.randn(1, heads, v).to(device)
    y = torch.empty(1, heads, cols, device=device)
    qmatmul_t_kquant(x, w, v, nope, nope + v, y, tiles=tiles)
    assert rel_err(y, qmatmul_t_ref(x, w, v, nope, nope + v)) < FP32_TOL


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_qmatmul_t_takes_it_at_decode_only(qtype, device) -> None:
    """qmatmul_t's decode token counts with many heads go through it, with the same result."""
    heads = FEW_GROUPS
    w = weight(qtype, heads * 8, 256, seed=3, device=device)
    for m in (1, 5, 12):
        x = torch.randn(m, heads, 4).to(device)
        got = qmatmul_t(x, w, in_rows=4, row0=0, gstride=8)
        assert rel_err(got, qmatmul_t_ref(x, w, 4, 0, 8)) < 2e-5
        assert takes(w, m) == (m <= 8)
    assert {bm for t, bm in TILES if t == qtype} == {1, 2, 4, 8}  # each decode token block


def test_refuses_what_it_cannot_tile(device) -> None:
    w = weight(Q.Q4_K, 8, 512, seed=1, device=device)
    with pytest.raises(ValueError, match="chunks a program"):
        qmatmul_t_kquant(torch.randn(1, 1, 8).to(device), w, 8, 0, 0,
                         torch.empty(1, 1, 512, device=device), tiles=(8, 3, 1))
    with pytest.raises(ValueError, match="need Q4_K or Q6_K"):
        qmatmul_t_kquant(torch.randn(1, 1, 8).to(device), weight(Q.Q8_0, 8, 512, 1, device),
                         8, 0, 0, torch.empty(1, 1, 512, device=device))
