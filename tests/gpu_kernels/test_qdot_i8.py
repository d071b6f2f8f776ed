"""Integer-activation decode products (qdot_i8; Q6_K's in qdot_i8_q6k) against their float64
reference, and the error that quantizing x adds against the exact fp32 product, over shapes,
groups, tiles and bits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from gpu_kernels.qdot_i8 import (
    LONG_TILES,
    SHORT_TILES,
    dequantize_x,
    pair_order,
    qmatmul_i8,
    qmatmul_i8_ref,
    quantize_x,
    quantize_x_ref,
)
from gpu_kernels.qdot_i8_q6k import qmatmul_i8_q6k, qmatmul_i8_q6k_ref
from gpu_kernels.qmatmul import qmatmul, qmatmul_ref
from tests.gpu_kernels.conftest import rel_err
from tests.gpu_kernels.test_qmatmul import weight

KERNEL_TOL = 1e-5  # the kernel against its reference: fp32 sums of exact integer dots
X_ERROR = {16: 2e-4, 8: 5e-2}  # quantized x against the exact product (measured ~3e-5 / ~1e-2)


def test_pair_order_is_a_permutation_of_each_16() -> None:
    order = pair_order(64)
    assert sorted(order.tolist()) == list(range(64))
    assert (order // 16 == torch.arange(64) // 16).all()
    assert order[:4].tolist() == [0, 1, 8, 9]  # columns 0, 1 then 2, 3 four words on


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("shape", [(1, 1, 256), (3, 1, 512), (2, 3, 128)])
def test_quantize_x(bits: int, shape: tuple[int, int, int], device: torch.device) -> None:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(bits))
    x[0, 0, :32] = 0.0  # an all-zero block: scale 0, codes 0
    xq = quantize_x(x.to(device), bits)
    ref = quantize_x_ref(x, bits)
    assert (xq.q.cpu().int() - ref.q.int()).abs().max() <= 1  # rounding at exact halves
    assert torch.allclose(xq.d.cpu(), ref.d) and torch.allclose(xq.s.cpu(), ref.s, atol=1e-5)
    # each element within half a step of its block (plus one step where rounding differs)
    step = ref.d.repeat_interleave(32, dim=1)
    err = (dequantize_x(xq).cpu() - x.reshape(-1, shape[-1]).double()).abs()
    assert (err <= 1.5 * step + 1e-12).all()


def test_quantize_x_strided_groups(device: torch.device) -> None:
    """x [M, G, K] as a view (MLA's per-head latents): rows are token-major."""
    base = torch.randn(2, 4, 320)
    x = base[:, 1:, :256]  # strides (1280, 320, 1)
    xq = quantize_x(x.to(device))
    assert xq.q.shape == (6, 256)
    assert (xq.q.cpu().int() - quantize_x_ref(x.contiguous()).q.int()).abs().max() <= 1


# each integer kernel and its reference (qdot_i8_q6k.py: Q6_K's)
PRODUCTS = {Q.Q4_K: (qmatmul_i8, qmatmul_i8_ref), Q.Q6_K: (qmatmul_i8_q6k, qmatmul_i8_q6k_ref)}


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("rows,cols,m", [(8, 256, 1), (37, 512, 1), (13, 1536, 2),
                                         (70, 2048, 1), (5, 1024, 3)])
def test_qmatmul_i8(qtype, bits: int, rows: int, cols: int, m: int,
                    device: torch.device) -> None:
    product, ref = PRODUCTS[qtype]
    w = weight(qtype, rows, cols, seed=rows, device=device)
    x = torch.randn(m, cols, generator=torch.Generator().manual_seed(cols)).to(device)
    xq = quantize_x(x, bits)
    y = product(xq, w)
    assert y.shape == (m, rows)
    assert rel_err(y, ref(xq, w)[:, 0]) < KERNEL_TOL
    assert rel_err(y, qmatmul_ref(x, w)) < X_ERROR[bits]


@pytest.mark.parametrize("tiles", [LONG_TILES, SHORT_TILES, (1, 2, 1), (2, 8, 1), (16, 1, 4)])
def test_tiles(tiles: tuple[int, int, int], device: torch.device) -> None:
    """Any tile gives the same result; rows that do not fill a program are masked."""
    w = weight(Q.Q4_K, 19, 1024, seed=5, device=device)
    xq = quantize_x(torch.randn(1, 1024).to(device))
    assert rel_err(qmatmul_i8(xq, w, tiles=tiles), qmatmul_i8_ref(xq, w)[:, 0]) < KERNEL_TOL


@pytest.mark.parametrize("m", [1, 2])
def test_grouped(m: int, device: torch.device) -> None:
    """MLA's per-head products: group g reads rows row0 + g * gstride + [0, n)."""
    heads, nope, v, c = 3, 32, 24, 256
    w = weight(Q.Q4_K, heads * (nope + v), c, seed=9, device=device)  # a legacy kv_b
    o_lat = torch.randn(m, heads, c).to(device)
    xq = quantize_x(o_lat)
    o = qmatmul_i8(xq, w, out_rows=v, row0=nope, gstride=nope + v, groups=heads)
    assert o.shape == (m, heads, v)
    assert rel_err(o, qmatmul_i8_ref(xq, w, v, nope, nope + v, heads)) < KERNEL_TOL
    assert rel_err(o, qmatmul_ref(o_lat, w, v, nope, nope + v)) < X_ERROR[16]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K])
def test_qmatmul_takes_the_integer_path_at_one_token(qtype, device: torch.device) -> None:
    w = replace(weight(qtype, 24, 512, seed=2, device=device), x_bits=16)
    x1 = torch.randn(1, 512).to(device)
    y1 = qmatmul(x1, w)
    assert torch.equal(y1, PRODUCTS[qtype][0](quantize_x(x1), w))
    assert rel_err(y1, qmatmul_ref(x1, w)) < X_ERROR[16]
    x2 = torch.randn(2, 512).to(device)  # two tokens: fp32 products
    assert rel_err(qmatmul(x2, w), qmatmul_ref(x2, w)) < 1e-5
    w8 = replace(weight(Q.Q8_0, 24, 512, seed=2, device=device), x_bits=16)
    assert rel_err(qmatmul(x1, w8), qmatmul_ref(x1, w8)) < 1e-5  # no integer body: fp32


def test_bad_input(device: torch.device) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_x(torch.randn(1, 48).to(device))
    xq = quantize_x(torch.randn(1, 256).to(device))
    with pytest.raises(ValueError, match="Q8_0"):
        qmatmul_i8(xq, weight(Q.Q8_0, 4, 256, seed=1, device=device))
    with pytest.raises(ValueError, match="features"):
        qmatmul_i8(xq, weight(Q.Q4_K, 4, 512, seed=1, device=device))


def test_fused_producers_give_the_same_product(device: torch.device) -> None:
    """x quantized by the norm (or SiLU) that wrote it = x quantized by qmatmul itself, to
    rounding: the blocks' fp32 sums may add in another order (on the H100: ~1e-7)."""
    from gpu_kernels.fused import add_rmsnorm, silu_mul
    from gpu_kernels.qdot_i8 import empty_xq

    w = replace(weight(Q.Q4_K, 40, 512, seed=4, device=device), x_bits=16)
    g = torch.Generator().manual_seed(4)
    x, norm_w = torch.randn(1, 512, generator=g).to(device), torch.rand(512, generator=g)
    xq = empty_xq(1, 512, 16, device)
    h = add_rmsnorm(x, norm_w.to(device), 1e-6, xq=xq)
    alone = quantize_x(h)
    assert (xq.q.int() - alone.q.int()).abs().max() <= 1 and torch.allclose(xq.d, alone.d)
    assert rel_err(qmatmul(h, w, xq=xq), qmatmul(h, w)) < 1e-6
    gu = torch.randn(1, 1024, generator=g).to(device)
    mid_q = empty_xq(1, 512, 16, device)
    mid = silu_mul(gu, xq=mid_q)
    assert (mid_q.q.int() - quantize_x(mid).q.int()).abs().max() <= 1
    assert rel_err(qmatmul(mid, w, xq=mid_q), qmatmul(mid, w)) < 1e-6
    w8 = replace(w, x_bits=8)  # codes of other bits than the weight takes: quantized again
    assert torch.equal(qmatmul(mid, w8, xq=mid_q), qmatmul(mid, w8))
