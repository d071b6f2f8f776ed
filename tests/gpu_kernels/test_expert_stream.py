"""Streamed experts (hybrid/engine/prefill/expert_stream.py) against the float64 reference on the
whole tensors: one unit a layer and several (a small memory budget), the fused gate_up layout,
layers streamed in any order and repeated, fp16 tensor cores within their stated error; and the
page ranges the host registration merges."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from cpu_kernels.fast.packed import PackedMatrix
from cpu_kernels.formats import qtypes as cpu_qtypes
from cpu_kernels.formats.random_blocks import random_rows
from cpu_kernels.formats.weights import QuantMatrix
from gpu_kernels import moe_dense
from gpu_kernels import qtypes as gqt
from gpu_kernels.moe_grouped import moe_experts_ref
from gpu_kernels.qformat import to_planes
from hybrid.engine.prefill.expert_stream import (
    BYTES_PER_UNIT_BYTE,
    ExpertStream,
    StreamTensor,
    expert_memory,
)
from hybrid.engine.prefill.host_pinning import byte_ranges
from tests.gpu_kernels.conftest import rel_err

E, K, H, INTER = 8, 2, 256, 256


pytestmark = pytest.mark.usefixtures("wide_tiles")


def _own_pages(a: np.ndarray) -> np.ndarray:
    """A copy on pages of its own: on CUDA the stream page-locks its arrays, and two live
    streams' arrays on one heap page would register it twice (the driver refuses)."""
    page = mmap.PAGESIZE
    buf = np.zeros(-(-a.nbytes // page) * page + page, np.uint8)
    at = -buf.ctypes.data % page
    out = buf[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def stack(qtype: Q, rows: int, cols: int, seed: int) -> QuantMatrix:
    raw = random_rows(np.random.default_rng(seed), int(qtype), E * rows, cols, 0.05)
    return QuantMatrix.from_raw(int(qtype), (E, rows, cols), _own_pages(raw))


def layer(seed: int, fused: bool = False) -> tuple[QuantMatrix, ...]:
    down = stack(Q.Q6_K, H, INTER, seed + 2)
    if fused:
        return stack(Q.Q4_K, 2 * INTER, H, seed), down
    return stack(Q.Q4_K, INTER, H, seed), stack(Q.Q8_0, INTER, H, seed + 1), down


def reference(parts: tuple[QuantMatrix, ...], x, ids, w) -> torch.Tensor:
    planes = [to_planes(torch.from_numpy(m.blocks.copy()), m.qtype, E * m.rows, m.cols)
              for m in parts]
    if len(parts) == 2:  # fused: each expert's gate rows, then its up rows
        gate_up = torch.from_numpy(parts[0].blocks.copy())  # [E, 2I, B]
        planes = [to_planes(gate_up[:, :INTER].contiguous(), parts[0].qtype, E * INTER, H),
                  to_planes(gate_up[:, INTER:].contiguous(), parts[0].qtype, E * INTER, H),
                  planes[1]]
    return moe_experts_ref(x.cpu(), ids.cpu(), w.cpu(), *planes, E)


def routing(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(n)])
    return torch.randn(n, H, generator=g), ids, torch.rand(n, K, generator=g)


@pytest.mark.parametrize("units,fused,n", [(1, False, 3), (3, False, 20), (1, True, 12),
                                           (4, True, 3)])
def test_stream_matches_reference(units: int, fused: bool, n: int, device) -> None:
    layers = [layer(10, fused), layer(20, fused)]
    per_expert = sum(m.expert_nbytes for m in layers[0])
    memory = int(BYTES_PER_UNIT_BYTE * per_expert * -(-E // units)) + 1
    stream = ExpertStream(layers, device, memory, fp16=False)
    assert -(-E // stream.experts_per_unit) == units
    x, ids, w = routing(n, seed=n)
    order = [1, 0, 1] if units == 3 else [1, 0]  # any order, repeats allowed
    stream.begin(order)
    got = [stream.run(i, x.to(device), ids.to(device), w.to(device)) for i in order]
    refs = {i: reference(layers[i], x, ids, w) for i in set(order)}
    for i, y in zip(order, got):
        assert rel_err(y, refs[i]) < 2e-5


@pytest.mark.parametrize("qtype", [q for q in (*sorted(gqt.BLOCK_GEOMETRY), *gqt.FLOAT_DTYPES)
                                   if cpu_qtypes.is_supported(q)], ids=lambda q: Q(q).name)
def test_planes_hold_none_of_the_raw_slot(qtype: int, device) -> None:
    """A unit's planes outlive its raw slot (the next unit's bytes land there while its products
    run): none is a view of the slot, whatever the type (to_planes gives views for float
    types), and they equal the planes of a copy."""
    m = stack(Q(qtype), 32, 256, seed=qtype)
    t = StreamTensor.of(m)
    raw = torch.from_numpy(t.host.copy()).reshape(-1).to(device)
    got = t.planes(raw, E)
    base = raw.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() != base for p in got.planes)
    want = to_planes(raw.clone(), qtype, E * 32, 256)
    assert all(torch.equal(a, b) for a, b in zip(got.planes, want.planes, strict=True))


@pytest.mark.parametrize("types", [(Q.Q4_K, Q.Q8_0, Q.Q6_K), (Q.Q5_0, Q.Q5_0, Q.Q8_0),
                                   (Q.Q2_K, Q.Q2_K, Q.Q3_K)],
                         ids=lambda t: "-".join(q.name for q in t))
def test_packed_source_gives_the_gguf_sources_result(types, device) -> None:
    """Fast mode streams its packed copy: unpacked on the device into the same planes, so
    the same products, bit for bit."""
    gguf = (stack(types[0], INTER, H, 50), stack(types[1], INTER, H, 51),
            stack(types[2], H, INTER, 52))
    packed = tuple(PackedMatrix.of(m) for m in gguf)
    packed = tuple(PackedMatrix(p.qtype, p.shape, _own_pages(p.data)) for p in packed)
    x, ids, w = routing(10, seed=4)
    x, ids, w = x.to(device), ids.to(device), w.to(device)
    out = []
    for parts in (gguf, packed):
        stream = ExpertStream([parts], device, 1 << 30, fp16=False)
        stream.begin([0])
        out.append(stream.run(0, x, ids, w))
    assert torch.equal(out[0], out[1])


def test_fp16_products_within_their_error(device) -> None:
    layers = [layer(30)]
    stream = ExpertStream(layers, device, 1 << 30, fp16=True)
    x, ids, w = routing(24, seed=3)  # fp32 products in blocks of 8 pairs, tensor cores in 16
    stream.begin([0, 0])
    ref = reference(layers[0], x, ids, w)
    for bm in (8, 16):
        y = stream.run(0, x.to(device), ids.to(device), w.to(device), bm=bm)
        assert rel_err(y, ref) < (2e-5 if bm <= 8 else 2e-3)


@pytest.mark.parametrize("units", [1, 3])
def test_many_pairs_multiply_on_weights_decoded_once(units: int, device, monkeypatch) -> None:
    """fp16 over many pairs: each unit's tensors decoded into fp16 rows (moe_dense.py), within
    the fp16 error; the memory budget counts those rows, and without room for them the stream
    stays on the tiles."""
    monkeypatch.setattr(moe_dense, "DENSE_MIN_PAIRS_PER_EXPERT", 2)
    layers = [layer(60, fused=units == 3)]
    streamed = [tuple(StreamTensor.of(m) for m in layers[0])]
    memory = expert_memory(streamed, True) * -(-E // units)
    stream = ExpertStream(layers, device, memory, fp16=True)
    assert stream.dense and -(-E // stream.experts_per_unit) == units
    x, ids, w = routing(12, seed=6)
    stream.begin([0])
    y = stream.run(0, x.to(device), ids.to(device), w.to(device))
    assert rel_err(y, reference(layers[0], x, ids, w)) < 2e-3
    assert not ExpertStream(layers, device, expert_memory(streamed, True) - 1, fp16=True).dense
    assert not ExpertStream(layers, device, 1 << 30, fp16=False).dense  # exact: tf32x3 tiles
    assert not ExpertStream(layers, device, 1 << 30, fp16=True, dense=False).dense
    default = ExpertStream(layers, device, None, fp16=True)  # a whole layer, decoded rows too
    assert default.dense and default.experts_per_unit == E


def test_unqueued_layer_and_too_little_memory_are_errors(device) -> None:
    layers = [layer(40), layer(41)]
    with pytest.raises(ValueError, match="holds no expert"):
        ExpertStream(layers, device, 1000, fp16=False)
    stream = ExpertStream(layers, device, 1 << 30, fp16=False)
    x, ids, w = routing(2, seed=1)
    for queued in ([], [1]):
        stream.begin(queued)
        with pytest.raises(RuntimeError, match="not the next one"):
            stream.run(0, x.to(device), ids.to(device), w.to(device))


def test_byte_ranges_merge_shared_pages() -> None:
    page = mmap.PAGESIZE
    buf = np.zeros(8 * page, np.uint8)
    base = -(-buf.ctypes.data // page) * page - buf.ctypes.data  # first page boundary in buf
    a = buf[base + 10:base + page + 5]  # pages 0-1
    b = buf[base + page + 100:base + 2 * page]  # page 1: shares a page with a
    c = buf[base + 4 * page:base + 5 * page]  # page 4 alone
    start = buf.ctypes.data + base
    assert byte_ranges([c, a, b, buf[:0]]) == [(start, start + 2 * page),
                                               (start + 4 * page, start + 5 * page)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA driver registers pages")
def test_a_refused_registration_leaves_cuda_usable() -> None:
    """Pages registered twice: the second registration is refused (copies then go from
    pageable memory) and the error it left does not surface at the next launch."""
    from hybrid.engine.prefill.host_pinning import HostRegistration

    a = _own_pages(np.arange(1 << 16, dtype=np.uint8))
    first = HostRegistration([a])
    second = HostRegistration([a])
    assert first.ok and not second.ok
    y = torch.from_numpy(a).cuda(non_blocking=True).float().sum()
    assert float(y) == float(a.astype(np.float64).sum())
    first.release()
