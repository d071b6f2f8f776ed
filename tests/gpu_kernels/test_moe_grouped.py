"""Routed experts in grouped launches against their float64 reference: types, token counts on
both sides of the tensor-core threshold, skewed routing, left-out experts, fused gate_up, and
the expert-sorted block index on its own."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from cpu_kernels.formats.random_blocks import random_rows
from gpu_kernels.moe_dense import moe_experts_dense
from gpu_kernels.moe_grouped import (
    align,
    block_rows,
    moe_experts,
    moe_experts_ref,
)
from gpu_kernels.qformat import GpuQuant, to_planes
from tests.gpu_kernels.conftest import rel_err

H, INTER = 256, 256


def stacked(qtype: Q, experts: int, rows: int, cols: int, seed: int,
            device: torch.device) -> GpuQuant:
    """An [E, rows, cols] expert tensor as the GGUF stores it, as one GpuQuant."""
    raw = random_rows(np.random.default_rng(seed), int(qtype), experts * rows, cols, 0.05)
    return to_planes(torch.from_numpy(raw.copy()), int(qtype), experts * rows, cols).to(device)


def fused(gate: GpuQuant, up: GpuQuant, experts: int) -> GpuQuant:
    """Gate and up [E * I, H] each as the fused GGUF layout's one [E * 2I, H] tensor: each
    expert's gate rows, then its up rows."""
    planes = tuple(torch.cat([a.view(experts, INTER, -1), b.view(experts, INTER, -1)], 1)
                   .reshape(experts * 2 * INTER, -1) for a, b in zip(gate.planes, up.planes))
    return GpuQuant(gate.qtype, experts * 2 * INTER, H, planes)


def routing(n: int, k: int, experts: int, seed: int, skew: bool = False):
    g = torch.Generator().manual_seed(seed)
    if skew:  # most pairs on expert 0
        ids = torch.where(torch.rand(n, k, generator=g) < 0.6, 0,
                          torch.randint(1, experts, (n, k), generator=g))
        ids[:, 1:] = (ids[:, :1] + torch.arange(1, k)) % experts  # distinct per token
    else:
        ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(n)])
    return ids, torch.rand(n, k, generator=g)


# (gate/up type, down type, tokens), top-2 of 4 experts: blocks of 1 and 4 pairs (fp32
# products), 16 and 32 (tensor cores; the last with most pairs on one expert)
CASES = [(Q.Q4_K, Q.Q6_K, 1), (Q.Q8_0, Q.Q8_0, 6), (Q.Q5_0, Q.Q4_K, 24), (Q.Q4_K, Q.Q6_K, 48),
         (Q.IQ4_XS, Q.IQ4_NL, 6), (Q.MXFP4, Q.MXFP4, 6), (Q.MXFP4, Q.Q8_0, 24)]


@pytest.mark.parametrize("gate_type,down_type,n", CASES,
                         ids=lambda v: v.name if isinstance(v, Q) else str(v))
def test_matches_reference(gate_type: Q, down_type: Q, n: int, device: torch.device) -> None:
    experts, k = 4, 2
    types = (gate_type, down_type)
    gate = stacked(types[0], experts, INTER, H, 1, device)
    up = stacked(types[0], experts, INTER, H, 2, device)
    down = stacked(types[1], experts, H, INTER, 3, device)
    ids, w = routing(n, k, experts, seed=n, skew=n == 48)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(5))
    ids, w, x = ids.to(device), w.to(device), x.to(device)
    y = moe_experts(x, ids, w, (gate, up), down, experts)
    assert rel_err(y, moe_experts_ref(x, ids, w, gate, up, down, experts)) < 2e-5


@pytest.mark.parametrize("n", [3, 40])
def test_clamped_swiglu(n: int, device: torch.device) -> None:
    """DeepSeek-V4's experts clamp their SwiGLU (gate from above, up on both sides): the tiles
    and the weights decoded once follow the reference's clamp; the limit is low enough (with
    x at 4x scale) that it acts on many sums."""
    experts, k, limit = 4, 2, 0.05
    gate = stacked(Q.MXFP4, experts, INTER, H, 1, device)
    up = stacked(Q.MXFP4, experts, INTER, H, 2, device)
    down = stacked(Q.Q8_0, experts, H, INTER, 3, device)
    ids, w = routing(n, k, experts, seed=n)
    x = 4 * torch.randn(n, H, generator=torch.Generator().manual_seed(6))
    ids, w, x = ids.to(device), w.to(device), x.to(device)
    ref = moe_experts_ref(x, ids, w, gate, up, down, experts, limit)
    assert rel_err(ref, moe_experts_ref(x, ids, w, gate, up, down, experts)) > 1e-2
    assert rel_err(moe_experts(x, ids, w, (gate, up), down, experts, limit=limit), ref) < 2e-5
    assert rel_err(moe_experts_dense(x, ids, w, (gate, up), down, experts, limit), ref) < 2e-3


def test_fused_gate_up_and_left_out_experts(device: torch.device) -> None:
    """Gate and up as one [E * 2I, H] tensor (fused GGUF layout), on the tiles and on weights
    decoded once; pairs with a negative id (experts held elsewhere) add nothing."""
    experts, k, n = 4, 2, 20
    gate = stacked(Q.Q4_K, experts, INTER, H, 1, device)
    up = stacked(Q.Q4_K, experts, INTER, H, 2, device)
    gate_up = fused(gate, up, experts)
    down = stacked(Q.Q6_K, experts, H, INTER, 3, device)
    ids, w = routing(n, k, experts, seed=9)
    ids[::3, 0] = -1
    x = torch.randn(n, H).to(device)
    ids, w = ids.to(device), w.to(device)
    ref = moe_experts_ref(x, ids, w, gate, up, down, experts)
    assert rel_err(moe_experts(x, ids, w, (gate_up,), down, experts), ref) < 2e-5
    assert rel_err(moe_experts(x, ids, w, (gate, up), down, experts), ref) < 2e-5
    # weights decoded once into fp16 (gpu_kernels/moe_dense.py): within fp16's rounding
    assert rel_err(moe_experts_dense(x, ids, w, (gate_up,), down, experts), ref) < 2e-3


@pytest.mark.parametrize("bm", [1, 4, 16])
def test_align_groups_every_held_pair_once(bm: int) -> None:
    experts = 5
    # -1: not held; 9: a padded row's garbage id, left out like it
    ids = torch.tensor([[0, 3], [3, 4], [-1, 0], [3, 1], [0, 3], [9, 2]])
    slots, block_expert = align(ids, experts, bm)
    nk = ids.numel()
    assert block_expert.shape[0] == -(-nk // bm) + min(experts, nk)
    assert slots.shape[0] == block_expert.shape[0] * bm
    seen = []
    for b, e in enumerate(block_expert.tolist()):
        block = slots[b * bm:(b + 1) * bm].tolist()
        if e < 0:
            assert all(s == -1 for s in block)
            continue
        for s in block:
            if s >= 0:
                assert ids.reshape(-1)[s] == e
                seen.append(s)
    held = [i for i, e in enumerate(ids.reshape(-1).tolist()) if 0 <= e < experts]
    assert sorted(seen) == held
    # experts in order, each run in whole blocks
    real = [e for e in block_expert.tolist() if e >= 0]
    assert real == sorted(real)


def test_block_rows_follow_the_pairs_per_expert() -> None:
    assert block_rows(6, 64) == 1  # one decode token
    assert block_rows(8 * 512, 256) == 16  # 512 tokens over V3's experts
    assert block_rows(6 * 2048, 64) == 64


@pytest.mark.parametrize("tiles", [None, (64, 128, 4, 1)], ids=["default", "wide"])
def test_fp16_tensor_cores_and_other_tiles(tiles, device: torch.device) -> None:
    """The prefill form: fp16 tiles on the tensor cores, any tiling."""
    experts, k, n = 4, 2, 24
    gate = stacked(Q.Q4_K, experts, INTER, H, 1, device)
    up = stacked(Q.Q4_K, experts, INTER, H, 2, device)
    down = stacked(Q.Q8_0, experts, H, INTER, 3, device)
    ids, w = routing(n, k, experts, seed=4)
    x = torch.randn(n, H).to(device)
    ids, w = ids.to(device), w.to(device)
    ref = moe_experts_ref(x, ids, w, gate, up, down, experts)
    y = moe_experts(x, ids, w, (gate, up), down, experts, tiles=tiles, fp16=True)
    assert 1e-5 < rel_err(y, ref) < 2e-3  # rounded, and not by much (5e-4 seen)
