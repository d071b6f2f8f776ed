"""Which decode attention backend an engine runs: `--attention-backend` (auto, triton,
flashinfer) and the model's attention operators decide.

"auto" takes flashinfer for models of >= FLASHINFER_MIN_HEADS heads when it can run here, ours
otherwise (the measurements behind that line: docs/gpu-path.md, "Decode attention"). Operators
that do not run gpu_kernels (the CPU) take the torch backend whatever the choice.
"""

from __future__ import annotations

import logging

import torch

from hybrid.engine.attention.base import DecodeAttention
from hybrid.engine.config import ATTENTION_BACKENDS
from hybrid.errors import HybridError

log = logging.getLogger("hybrid.engine")

FLASHINFER_MIN_HEADS = 64  # "auto": below this ours measured as fast or faster


def resolve(choice: str, attention_ops: list) -> str:
    """The backend the engine runs on CUDA ("triton" or "flashinfer") for `choice` and the
    model's attention operators. An explicit "flashinfer" that cannot run raises, naming why."""
    from gpu_kernels.mla_decode_flashinfer import available

    if choice not in ATTENTION_BACKENDS:
        raise HybridError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                          f"got {choice!r}")
    if choice == "triton":
        return "triton"
    first = attention_ops[0]
    problem = None
    if any(op.device.type != "cuda" for op in attention_ops):
        problem = "attention runs on the CPU here (flashinfer needs every layer's on CUDA)"
    elif len({str(op.device) for op in attention_ops}) > 1:
        problem = "attention is spread over several GPUs (one flashinfer plan serves one)"
    elif (first.kv_lora, first.rope) != (512, 64):
        problem = (f"its MLA kernels take 512 latent + 64 rope dims (every DeepSeek-V2/V3-"
                   f"architecture model's), this model has {first.kv_lora} + {first.rope}")
    elif first.kv_dtype not in (torch.bfloat16, torch.float16):
        problem = f"the KV cache is {first.kv_dtype} (flashinfer reads bf16 or f16)"
    elif not available():
        problem = "flashinfer is not installed: pip install -e \".[flashinfer]\""
    if choice == "flashinfer":
        if problem:
            raise HybridError(f"--attention-backend flashinfer: {problem}; or use triton")
        return "flashinfer"
    if problem or first.heads < FLASHINFER_MIN_HEADS:
        return "triton"
    return "flashinfer"


def build(choice: str, attention_ops: list, page_size: int, max_pages: int) -> DecodeAttention:
    """The engine's backend. flashinfer failing to start (its kernels fail to build: no nvcc,
    an unsupported GPU) falls back to ours under "auto" with a warning, and raises naming the
    failure when asked for by name. Operators off gpu_kernels (any of them) take torch's: one
    backend serves every layer."""
    name = resolve(choice, attention_ops)
    if not all(op.uses_gpu_kernels for op in attention_ops):
        from hybrid.engine.attention.torch_decode import TorchDecode

        return TorchDecode()
    if name == "flashinfer":
        from hybrid.engine.attention.flashinfer_decode import FlashInferDecode

        try:
            return FlashInferDecode(attention_ops[0], page_size, max_pages)
        except Exception as e:  # flashinfer's build and runtime errors vary
            if choice == "flashinfer":
                raise HybridError(f"flashinfer's MLA decode failed to start "
                                  f"({type(e).__name__}: {str(e)[:300]}); use "
                                  f"--attention-backend triton") from e
            log.warning("flashinfer's MLA decode failed to start (%s: %s); decode attention "
                        "runs on ours (triton)", type(e).__name__, str(e)[:300])
    from hybrid.engine.attention.triton_decode import TritonDecode

    return TritonDecode(attention_ops[0].heads, max_pages * page_size)
