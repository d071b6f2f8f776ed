"""Start-up of the streamed-experts path: build the ExpertStream over the bridged MoE layers,
compile its kernel variants, and measure the cost model `--prefill-experts auto` follows.

Calibration (CUDA only; a few hundred ms for V2-Lite shapes, a few seconds for V3's):
- streamed: `streamed_layer_ms` at each token count of STREAM_TOKENS and at the largest prompt
  step (the cost model would extrapolate there otherwise; fast mode's products change method
  at many tokens, gpu_kernels/moe_dense.py), random routing;
- CPU: the same layer's `run_host` at each count of CPU_TOKENS (best of two after one run).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from hybrid.engine.config import EngineConfig
from hybrid.engine.prefill.expert_stream import ExpertStream
from hybrid.engine.prefill.prefill_costs import ExpertPlacement, PrefillCosts
from hybrid.errors import HybridError
from hybrid.ops.experts import ExpertsOp

log = logging.getLogger("hybrid.engine")

STREAM_TOKENS = (128, 512, 2048)
STREAM_REPEATS = 4
CPU_TOKENS = (1, 16, 64, 256)


def build_stream(layers: list[ExpertsOp], config: EngineConfig, device: torch.device
                 ) -> ExpertStream | None:
    """The stream over `layers` (the decoder's bridged MoE layers), or None: with no such
    layer, `--prefill-experts cpu`, auto without CUDA, or where it cannot run (no gpu_kernels
    on `device`, types they lack; `--prefill-experts stream` then is an error). A model over
    several GPUs streams every layer's experts to `device` (the decoder moves the rows)."""
    from hybrid.ops.kernel_sets import uses_gpu_kernels

    if not layers or config.prefill_experts == "cpu" or (config.prefill_experts == "auto"
                                                         and device.type != "cuda"):
        return None  # auto needs a PCIe copy to measure; the interpreter is for tests
    why = _why_not(layers, device, uses_gpu_kernels(device))
    parts = [_source(op) for op in layers]
    if why is None:
        why = _host_memory_short(layers, parts, device)
    if why is None:
        fast = layers[0].mode == "fast"
        memory = None if config.stream_memory_gib is None \
            else int(config.stream_memory_gib * 2**30)  # None: the stream's default
        try:
            return ExpertStream(parts, device, memory, fp16=fast, dense=config.dense_prefill)
        except ValueError as e:
            why = str(e)
    if config.prefill_experts == "stream":
        raise HybridError(f"--prefill-experts stream: {why}; use --prefill-experts auto or cpu")
    log.info("prompt steps run the routed experts on the CPU only: %s", why)
    return None


def _why_not(layers: list[ExpertsOp], device: torch.device, kernels: bool) -> str | None:
    if not kernels:
        return f"the model runs on {device}, not a CUDA device"
    from gpu_kernels.qtypes import is_supported

    for op in layers:
        if op.stream_parts is None or not all(is_supported(m.qtype) for m in op.stream_parts):
            return "the GPU kernels lack a type of the experts"
    if len({p.num_experts for op in layers for p in op.stream_parts}) != 1:
        return "MoE layers have different expert counts"
    if any(op.swiglu_limit != math.inf for op in layers):
        return "the experts clamp their SwiGLU (DeepSeek-V4), which the stream does not"
    return None


def _source(op: ExpertsOp) -> tuple:
    """What a layer streams: the bytes its CPU kernels read. Exact mode: the GGUF's blocks;
    fast mode: the packed copy where gpu_kernels/packed_planes.py unpacks every tensor, else
    the GGUF's."""
    from gpu_kernels.packed_planes import can_unpack

    packed = op.cpu_weights.packed
    if packed is not None:
        mats = (packed.gate, packed.up, packed.down)
        if all(can_unpack(m.qtype, m.shape[1]) for m in mats):
            return mats
    return op.stream_parts


def _host_memory_short(layers: list[ExpertsOp], parts: list[tuple],
                       device: torch.device) -> str | None:
    """Streaming page-locks the bytes it reads. Where a fast-mode layer streams the GGUF's
    blocks (a packed copy gpu_kernels/packed_planes.py cannot unpack: rows not whole groups of
    8), its CPU kernels read the packed copy and the GGUF's pages would be locked beside it:
    allowed only while the machine keeps a tenth of its memory free after that."""
    extra = [p for op, p in zip(layers, parts)
             if op.cpu_weights.packed is not None and p is op.stream_parts]
    if device.type != "cuda" or not extra:
        return None
    import psutil

    pinned = sum(m.nbytes for p in extra for m in p)
    mem = psutil.virtual_memory()
    if mem.available - pinned >= mem.total // 10:
        return None
    return (f"fast mode's packed experts are resident and page-locking the GGUF's "
            f"{pinned / 2**30:.0f} GiB of experts beside them would leave "
            f"{max(0, mem.available - pinned) / 2**30:.0f} of {mem.total / 2**30:.0f} GiB "
            f"free; run the experts in exact mode to stream from the same bytes")


def warm_up(stream: ExpertStream, layer: ExpertsOp, hidden: int) -> None:
    """Compile the grouped launches' every block size for each mix of types the layers have
    (Q4_K_M files vary the down projection's type by layer): one token each, one layer of each
    mix streamed once per size."""
    from gpu_kernels.qmatmul import TOKEN_CLASSES

    x, ids, weights = _routing(1, hidden, layer.num_experts, layer.top_k, stream.device)
    mixes = {tuple((m.qtype, m.packed) for m in parts): i for i, parts in enumerate(stream.layers)}
    for i in mixes.values():
        stream.begin([i] * len(TOKEN_CLASSES))
        for bm in TOKEN_CLASSES:
            stream.run(i, x, ids, weights, bm=bm)


def placement(stream: ExpertStream | None, layers: list[ExpertsOp], config: EngineConfig,
              hidden: int, progress: Callable[[str], None] | None = None,
              largest: int = 0) -> ExpertPlacement:
    """The step-by-step choice, calibrated where it is "auto" on CUDA (up to `largest` tokens,
    the largest prompt step, too)."""
    if stream is None:
        return ExpertPlacement("cpu", ())
    nbytes = tuple(stream.layer_nbytes)
    if config.prefill_experts != "auto":
        return ExpertPlacement(config.prefill_experts, nbytes)
    if progress is not None:
        progress("measuring streamed against CPU experts")
    counts = tuple(sorted({*STREAM_TOKENS, *([largest] if largest > STREAM_TOKENS[-1] else [])}))
    costs = calibrate(stream, layers[0], hidden, counts)
    cross = costs.crossover()
    log.info("streamed experts (%s, %d of %d experts a copy): a layer %s; from %s tokens a "
             "step streams", "page-locked" if stream.pinned else "pageable",
             stream.experts_per_unit, stream.num_experts,
             ", ".join(f"{n} tokens {s:.1f} ms streamed / {c:.1f} ms CPU"
                       for n in (*CPU_TOKENS, *counts)
                       for s, c in [costs.costs(n, costs.layer_nbytes)]),
             cross if cross is not None else "no count measured")
    return ExpertPlacement("auto", nbytes, costs)


def streamed_layer_ms(stream: ExpertStream, x: torch.Tensor, ids: torch.Tensor,
                      weights: torch.Tensor, repeats: int = STREAM_REPEATS) -> float:
    """Steady-state ms of one streamed layer (CUDA): the stream's first layer streamed
    `repeats` times in a row, timed between the first and the last one's end, so each copy
    overlaps the previous layer's kernels as in a step."""
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    stream.begin([0] * repeats)
    for end in ends:
        stream.run(0, x, ids, weights)
        end.record()
    ends[-1].synchronize()
    return ends[0].elapsed_time(ends[-1]) / (repeats - 1)


def calibrate(stream: ExpertStream, layer: ExpertsOp, hidden: int,
              stream_tokens: tuple[int, ...] = STREAM_TOKENS) -> PrefillCosts:
    dev, k = stream.device, layer.top_k
    stream_ms = [(n, streamed_layer_ms(stream, *_routing(n, hidden, layer.num_experts, k, dev)))
                 for n in stream_tokens]
    cpu_ms = []
    for n in CPU_TOKENS:
        x, ids, weights = (t.cpu().numpy() for t in _routing(n, hidden, layer.num_experts, k,
                                                              torch.device("cpu")))
        out = np.empty_like(x)
        times = []
        for _ in range(4):  # the first may compile a token-count specialization
            t0 = time.perf_counter()
            layer.run_host(x, ids, weights, out)
            times.append(time.perf_counter() - t0)
        cpu_ms.append((n, 1e3 * min(times[1:])))
    # more tokens never cost less: a noisy host's outlier must not make 16 tokens dearer than
    # 64 (one did, and every prompt then streamed: docs/long-prompts.md)
    for i in range(len(cpu_ms) - 2, -1, -1):
        cpu_ms[i] = (cpu_ms[i][0], min(cpu_ms[i][1], cpu_ms[i + 1][1]))
    return PrefillCosts(stream.layer_nbytes[0], tuple(stream_ms), tuple(cpu_ms))


def _routing(n: int, hidden: int, num_experts: int, k: int, device: torch.device):
    """Rows and uniformly random distinct experts per row: x [n, H] f32, ids [n, k] int64,
    weights [n, k] f32."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, hidden, generator=g)
    ids = torch.rand(n, num_experts, generator=g).topk(k, dim=1).indices
    weights = torch.rand(n, k, generator=g) / k
    return x.to(device), ids.to(device), weights.to(device)
