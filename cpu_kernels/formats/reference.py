"""Plain references for the kernels: gguf-py dequantization and float64 math (slow, exact)."""

from __future__ import annotations

import numpy as np

from cpu_kernels.formats.weights import ExpertWeights, QuantMatrix


def dequantize(w: QuantMatrix, expert: int = 0) -> np.ndarray:
    """W[expert] as float64 [rows, cols], dequantized by gguf-py."""
    from gguf import GGMLQuantizationType, quants

    vals = quants.dequantize(w.blocks[expert], GGMLQuantizationType(w.qtype))
    return np.asarray(vals, dtype=np.float64).reshape(w.rows, w.cols)


def matmul_ref(x: np.ndarray, w: QuantMatrix, expert: int = 0) -> np.ndarray:
    """x [n, C] @ W[expert].T -> float64 [n, R]."""
    return x.astype(np.float64) @ dequantize(w, expert).T


def swiglu_ref(g: np.ndarray, u: np.ndarray, limit: float) -> np.ndarray:
    """float64 silu(min(g, limit)) * clamp(u, -limit, limit) (limit inf: plain SwiGLU)."""
    g = np.minimum(np.asarray(g, np.float64), limit)
    return g / (1.0 + np.exp(-g)) * np.clip(np.asarray(u, np.float64), -limit, limit)


def moe_forward_ref(x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                    experts: ExpertWeights) -> np.ndarray:
    """float64 [T, H]: per token, sum_k w_k * down_e(swiglu(gate_e x, up_e x)), e = topk_ids[t, k]
    (a negative id is a slot served elsewhere: skipped; swiglu clamped at experts.swiglu_limit,
    exact/swiglu.py)."""
    x64 = x.astype(np.float64)
    out = np.zeros(x.shape, np.float64)
    for e in np.unique(topk_ids[topk_ids >= 0]):
        rows, slots = np.nonzero(topk_ids == e)
        xe = x64[rows]
        g = xe @ dequantize(experts.gate, e).T
        u = xe @ dequantize(experts.up, e).T
        h = swiglu_ref(g, u, experts.swiglu_limit)
        y = h @ dequantize(experts.down, e).T
        np.add.at(out, rows, y * topk_weights[rows, slots, None].astype(np.float64))
    return out


def rel_error(y: np.ndarray, ref: np.ndarray) -> float:
    """||y - ref|| / ||ref|| (Frobenius)."""
    return float(np.linalg.norm(y.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300))
