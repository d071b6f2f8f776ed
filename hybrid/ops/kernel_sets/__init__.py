"""The kernels an operator runs, chosen once when it is built: one interface, two sets.

    torch_set.py  `TorchKernels`: the interface, in torch (the references; operators off
                  gpu_kernels, as on the CPU)
    gpu_set.py    `GpuKernels`: the same calls on gpu_kernels (Triton, on the GGUF's blocks),
                  falling back to torch's for what its kernels do not take

Operators hold `self.kernels = kernels_for(device)` and call it: no device branches and no
kernel imports in hybrid/ops. tests/gpu_kernels/test_kernel_sets.py runs both sets against one
float64 reference.
"""

from __future__ import annotations

import torch

from hybrid.ops.kernel_sets.torch_set import MLADims, TorchKernels


def uses_gpu_kernels(device: torch.device) -> bool:
    """Whether operators on `device` run gpu_kernels: on CUDA, and on the CPU under
    HYBRID_GPU_KERNELS_ON_CPU=1 (Triton's interpreter; tests of the GPU path)."""
    if device.type == "cuda":
        return True
    from hybrid.env import Env

    return device.type == "cpu" and Env.read().gpu_kernels_on_cpu


def kernels_for(device: torch.device) -> TorchKernels:
    """The kernel set of operators placed on `device`."""
    if uses_gpu_kernels(device):
        from hybrid.ops.kernel_sets.gpu_set import GPU_KERNELS

        return GPU_KERNELS
    return TORCH_KERNELS


TORCH_KERNELS = TorchKernels()

__all__ = ["MLADims", "TorchKernels", "kernels_for", "uses_gpu_kernels"]
