"""`hybrid tune`'s one-screen summary and its JSON."""

from __future__ import annotations

from typing import Any

import numpy as np

from hybrid.tuning.results import TuneResult, variants_folder


def _tok_s(ms: float | None, batch: int) -> str:
    return f"{1000.0 * batch / ms:8.2f}" if ms else "       -"


def summary(result: TuneResult, batch: int = 1) -> str:
    freq = result.freq
    top = np.sort(freq, axis=1)[:, ::-1]
    quarter = max(1, freq.shape[1] // 4)
    share = float(top[:, :quarter].sum() / max(freq.sum(), 1e-12))
    lines = [
        (f"wrote {result.rules} (the compared placements' rule files: "
         f"{variants_folder(result.rules)}/)"),
        (f"GPU memory free for experts: {result.free_bytes / 2**30:.2f} GiB; "
        f"{sum(map(len, result.hot.values()))} experts in {len(result.hot)} layers"),
        *([_by_gpu(result)] if result.devices else []),
        (f"routing skew: the most used quarter of each layer's experts takes {share:.0%} of "
        f"the choices"),
        "",
        (f"{'placement':<28} {'GPU GiB':>8} {'hit rate':>8} {'CPU MB/step':>11} "
         f"{'CPU ms >=':>9} {'pred tok/s':>10} {'meas tok/s':>10} {'error':>6}"),
    ]
    for p in result.placements:
        err = (f"{(p.predicted_ms - p.measured_ms) / p.measured_ms:+.0%}"
               if p.predicted_ms and p.measured_ms else "")
        if p.calibration:
            err = "fit"  # measured to fit the model, not a prediction
        floor = p.cpu_bytes / 1e6 / result.read_gbs if result.read_gbs else 0.0
        lines.append(f"{p.name:<28} {p.gpu_bytes / 2**30:8.2f} {p.hit_rate:8.1%} "
                     f"{p.cpu_bytes / 1e6:11.2f} {floor:9.2f} "
                     f"{_tok_s(p.predicted_ms, batch):>10} "
                     f"{_tok_s(p.measured_ms, batch):>10} {err:>6}")
    lines.append(f"CPU ms >=: the routed experts' bytes the CPU reads per step over its read "
                 f"bandwidth ({result.read_gbs:.1f} GB/s): the CPU side's floor")
    if result.model is not None and result.model.is_noise:
        lines.append(f"warning: the calibration decodes fit {result.model.ms_per_gb:.1f} ms per "
                     "GB of CPU expert reads (more bytes were not slower): the step times are "
                     "noise, not a model, and the predictions above mean nothing; rerun with "
                     "more --steps on a quieter machine")
    elif result.model is not None:
        m = result.model
        fixed = (" (measured: the tuned rules' step with its CPU experts answered at once)"
                 if m.fixed_measured else "")
        lines.append(f"time model: {m.fixed_ms:.2f} ms fixed{fixed} + {m.ms_per_gb:.1f} ms per "
                     f"GB of CPU experts read + {m.ms_per_layer:.2f} ms per MoE layer with CPU "
                     "experts (fitted to the no-experts, full-budget and 'fit' rows)")
    for t, ms in result.threads:
        lines.append(f"--cpu-threads {t}: {_tok_s(ms, batch).strip()} tok/s decode")
    for c, tok_s in result.chunks:
        lines.append(f"--chunk-size {c}: {tok_s:.1f} tok/s prefill")
    return "\n".join(lines)


def _by_gpu(result: TuneResult) -> str:
    """Where a several-GPU tune put the hot experts."""
    parts = []
    for d in sorted(set(result.devices.values())):
        layers = [layer for layer, g in result.devices.items() if g == d]
        parts.append(f"{d}: {sum(len(result.hot[layer]) for layer in layers)} experts in "
                     f"{len(layers)} layers")
    return "hot experts by GPU: " + ", ".join(parts)


def to_json(result: TuneResult) -> dict[str, Any]:
    return {
        "rules": str(result.rules), "free_bytes": result.free_bytes,
        "cpu_read_gbs": result.read_gbs,
        "hot_experts": {str(k): v for k, v in result.hot.items()},
        "hot_expert_devices": {str(k): v for k, v in result.devices.items()},
        "placements": [{"name": p.name, "gpu_bytes": p.gpu_bytes, "hit_rate": p.hit_rate,
                        "cpu_bytes_per_step": p.cpu_bytes, "cpu_layers": p.cpu_layers,
                        "calibration": p.calibration, "rules": str(p.rules),
                        "predicted_ms": p.predicted_ms, "measured_ms": p.measured_ms,
                        "samples_ms": p.samples}
                       for p in result.placements],
        "threads": [{"cpu_threads": t, "ms": ms} for t, ms in result.threads],
        "chunk_sizes": [{"chunk_size": c, "prefill_tok_s": v} for c, v in result.chunks],
        "model": None if result.model is None else {
            "fixed_ms": result.model.fixed_ms, "fixed_measured": result.model.fixed_measured,
            "ms_per_gb": result.model.ms_per_gb,
            "ms_per_layer": result.model.ms_per_layer, "is_noise": result.model.is_noise},
    }
