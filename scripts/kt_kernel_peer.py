"""kt-kernel (KTransformers' CPU MoE kernels) as a peer for bench_cpu_moe.py, on the same shapes.

kt-kernel ships as a 100 MB wheel; its AMX build of the extension (`kt_kernel/_kt_kernel_ext_amx*.so`)
and the libraries beside it (`kt_kernel.libs/`) suffice. Give their parent folder as
`--kt-root` (or KT_KERNEL_ROOT); the module is loaded from the file, without the package's
Python side. Backends, each a bench mode:

    kt-llamafile  its `MOE` on our experts' GGUF blocks as they are (Q4_K_M: Q4_K gate/up, Q6_K
                  down; the same bytes our kernels read), bf16 activations
    kt-amx-int4   `AMXInt4_MOE`, `AMXInt8_MOE`: its AMX backends, which quantize bf16 weights at
    kt-amx-int8   load (random bf16 weights here: speed does not depend on the values)

Timing: `calls` forward tasks are queued and waited for with one `sync()`; a row is the mean
over them, after warm-up calls (our rows are per-call medians). On the GPU machine every queued
task still took a whole multiple of 8 ms (rows of exactly 8.00, 16.00, 24.00 ms): kt-kernel's
task queue waits in 8 ms steps, so its rows are upper bounds, the kernel itself up to 8 ms
faster. That is what a caller of its queue gets; small-T rows say more about the queue than
about the kernel.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import time
from types import ModuleType

import numpy as np

from cpu_kernels.formats.weights import ExpertWeights

GGML_BF16 = 30
AMX_CLASSES = {"kt-amx-int4": "AMXInt4_MOE", "kt-amx-int8": "AMXInt8_MOE"}
MODES = ("kt-llamafile", *AMX_CLASSES)


def load_extension(root: str | None) -> ModuleType | None:
    """kt-kernel's AMX extension module from `root` (or KT_KERNEL_ROOT), None when absent."""
    root = root or os.environ.get("KT_KERNEL_ROOT")
    if not root:
        return None
    found = glob.glob(os.path.join(root, "kt_kernel", "_kt_kernel_ext_amx*.so"))
    if not found:
        raise FileNotFoundError(f"no kt_kernel/_kt_kernel_ext_amx*.so under {root}: unpack those "
                                "and kt_kernel.libs/ from the kt-kernel wheel there")
    spec = importlib.util.spec_from_file_location("kt_kernel_ext", found[0])
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class KtPeer:
    """One kt-kernel worker pool (`threads` threads, one NUMA subpool) and the MoEs built on it."""

    def __init__(self, ext: ModuleType, threads: int) -> None:
        self.ext = ext
        pool = ext.WorkerPoolConfig()
        pool.subpool_count = 1
        pool.subpool_numa_map = [0]
        pool.subpool_thread_count = [threads]
        self.cpu = ext.CPUInfer(pool)
        self._keep: list = []  # arrays kt-kernel holds pointers into

    def llamafile(self, experts: ExpertWeights, top_k: int):
        """kt's `MOE` reading our experts' GGUF blocks in place."""
        e, i, h = experts.num_experts, experts.intermediate_size, experts.hidden_size
        mask = np.zeros(e, np.uint8)
        cfg = self.ext.moe.MOEConfig(e, top_k, h, i, _ptr(mask))
        cfg.layer_idx, cfg.pool = 0, self.cpu.backend_
        cfg.m_block, cfg.group_min_len, cfg.max_len, cfg.group_max_len = 32, 10, 1024, 1024
        cfg.gate_proj = _ptr(experts.gate.blocks)
        cfg.up_proj = _ptr(experts.up.blocks)
        cfg.down_proj = _ptr(experts.down.blocks)
        cfg.gate_type, cfg.up_type = experts.gate.qtype, experts.up.qtype
        cfg.down_type, cfg.hidden_type = experts.down.qtype, GGML_BF16
        moe = self.ext.moe.MOE(cfg)
        to_logical = np.arange(e, dtype=np.int32)
        self.cpu.submit(moe.load_weights_task(_ptr(to_logical)))
        self.cpu.sync()
        self._keep += [mask, to_logical]
        return moe

    def amx(self, mode: str, num_experts: int, hidden: int, inter: int, top_k: int,
            rng: np.random.Generator):
        """kt's AMX int4/int8 MoE, quantized by kt from random bf16 weights at load."""
        one = [to_bf16_bits(rng.standard_normal(shape, np.float32) * 0.02)
               for shape in ((inter, hidden), (inter, hidden), (hidden, inter))]
        gate, up, down = (np.tile(w, (num_experts, 1, 1)) for w in one)  # [E, rows, cols] bf16
        cfg = self.ext.moe.MOEConfig(num_experts, top_k, hidden, inter, 0)
        cfg.max_len, cfg.pool = 1024, self.cpu.backend_
        cfg.gate_proj, cfg.up_proj, cfg.down_proj = _ptr(gate), _ptr(up), _ptr(down)
        to_logical = np.arange(num_experts, dtype=np.int64)
        cfg.physical_to_logical_map = _ptr(to_logical)
        moe = getattr(self.ext.moe, AMX_CLASSES[mode])(cfg)
        self.cpu.submit(moe.load_weights_task())
        self.cpu.sync()
        self._keep += [gate, up, down, to_logical]
        return moe

    def ms_per_call(self, moe, x: np.ndarray, topk_ids: np.ndarray, topk_weights: np.ndarray,
                    min_seconds: float = 0.5) -> tuple[float, int]:
        """(mean ms of `calls` queued forward calls, calls) on x [T, H] f32 (sent as bf16)."""
        xb = to_bf16_bits(x)  # [T, H] bf16 bits
        y = np.zeros_like(xb)
        ids = np.ascontiguousarray(topk_ids, np.int64)  # [T, K]
        w = np.ascontiguousarray(topk_weights, np.float32)  # [T, K]
        qlen = np.array([x.shape[0]], np.int32)

        def task():
            return moe.forward_task(_ptr(qlen), ids.shape[1], _ptr(ids), _ptr(w), _ptr(xb),
                                    _ptr(y), False)
        t = time.perf_counter()
        for _ in range(3):
            self.cpu.submit(task())
            self.cpu.sync()
        per_call = (time.perf_counter() - t) / 3
        calls = int(min(200, max(5, min_seconds / max(per_call, 1e-4))))
        t = time.perf_counter()
        for _ in range(calls):
            self.cpu.submit(task())
        self.cpu.sync()
        return (time.perf_counter() - t) / calls * 1e3, calls
