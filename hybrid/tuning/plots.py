"""`hybrid tune`'s plots (PNG, beside the rule file): the activation heat map (layer x expert,
experts in each layer's popularity order), hit rate against GPU GiB, and predicted against
measured decode speed. matplotlib draws them, on the Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybrid.tuning.planner import hit_rate, hot_experts
from hybrid.tuning.results import TuneResult


def write_plots(result: TuneResult, out_prefix: Path, batch: int = 1) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    freq = result.freq
    fig, ax = plt.subplots(figsize=(8, 5))
    im = ax.imshow(freq, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("expert id")
    ax.set_ylabel("MoE layer (profile order)")
    ax.set_yticks(range(len(result.layers)), [str(x) for x in result.layers], fontsize=6)
    ax.set_title("expert choices per token")
    fig.colorbar(im, ax=ax, label="share of tokens")
    paths.append(_save(fig, out_prefix.with_name(out_prefix.name + "-heatmap.png")))

    fig, ax = plt.subplots(figsize=(6, 4))
    budgets = np.linspace(0, result.free_bytes, 21)
    rates = [hit_rate(freq, result.layers, hot_experts(freq, result.layers, result.sizes,
                                                       int(b), batch)) for b in budgets]
    ax.plot(budgets / 2**30, [r * 100 for r in rates], marker=".")
    ax.set_xlabel("GPU GiB of experts")
    ax.set_ylabel("hit rate (%)")
    ax.set_title("expert choices served by the GPU")
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_prefix.with_name(out_prefix.name + "-hit-rate.png")))

    measured = [p for p in result.placements if p.measured_ms and p.predicted_ms]
    if measured:
        fig, ax = plt.subplots(figsize=(6, 4))
        pred = [1000.0 * batch / p.predicted_ms for p in measured]
        meas = [1000.0 * batch / p.measured_ms for p in measured]
        ax.scatter(pred, meas)
        for p, x, y in zip(measured, pred, meas):
            ax.annotate(p.name, (x, y), fontsize=7)
        lo, hi = min(pred + meas) * 0.9, max(pred + meas) * 1.1
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set_xlabel("predicted decode tok/s")
        ax.set_ylabel("measured decode tok/s")
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_prefix.with_name(out_prefix.name + "-predicted.png")))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
