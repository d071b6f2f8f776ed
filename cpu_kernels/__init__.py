"""Quantized CPU kernels for the routed experts of DeepSeek MoE layers.

Kernels compute directly on GGUF blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0, BF16, F16)
with numba; nothing here imports `hybrid`. Modes: `exact` (float32 math on the exactly dequantized
weights, <= 1e-5 relative error against float64) and `fast` (x quantized to int8 per 32-group for
gate/up, h to int16 as two int8 planes for down, 512-bit vpdpbusd dot products (16 rows each; two
256-bit ones on AVX-VNNI CPUs without AVX-512, vpmaddubsw + vpmaddwd on CPUs with AVX2 alone, e.g.
AMD Zen 3: the same integer sums, simd_pairs.dpbusd_ir) on the exact weights, repacked at load time
(fast/packed.py), for Q2_K/Q3_K/Q4_K/Q6_K/Q8_0/Q5_0; scalar int8 dots for the other types; its
error is nearly all from the int8 x, docs/architecture.md gives it). On CPUs with AMX (Sapphire
Rapids and later), fast mode runs the experts with >= 12 tokens in a call (prefill, big batches)
on AMX bf16 tiles instead (simd/amx.py, amx/amx_bf16_moe.py): their Q4_K/Q6_K/Q8_0/Q5_0 weights
dequantized once per call to bf16, x and h rounded to bf16, float32 sums (less error than the int8
path). Decode (fewer tokens per expert) stays on the int8 VNNI kernels. The kernels compile in only
the tile types they are given (fast/tile_set.py).

`moe_forward` (moe.py) runs synchronously on numba's threads. `MoEPool` (runtime/pool.py) runs it
asynchronously on persistent worker threads, one group per NUMA node, each computing a slice of
the experts' intermediate rows (runtime/placement.py, runtime/topology.py).

Folders, lowest first (tests/test_layers.py holds the order): formats/, simd/, exact/, fast/,
amx/, then moe.py, then runtime/.

NOTE: numba's on-disk cache (cache=True) keys a kernel on its own file only; after editing a
kernel file, delete cpu_kernels/*/__pycache__/*.nbi/*.nbc or callers in other files run stale code.
"""

from __future__ import annotations

from cpu_kernels import cache_lock

cache_lock.install()  # before any kernel is compiled and cached (see there)

from cpu_kernels.exact.matmul import quant_matmul
from cpu_kernels.exact.routing import group_by_expert
from cpu_kernels.formats.weights import ExpertWeights, QuantMatrix
from cpu_kernels.moe import moe_forward
from cpu_kernels.runtime.pool import MoEPool

__all__ = ["ExpertWeights", "MoEPool", "QuantMatrix", "group_by_expert", "moe_forward",
           "quant_matmul"]
