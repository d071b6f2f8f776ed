"""Which kernel attends the decode rows: ours (gpu_kernels.mla_decode, Triton: always there) or
flashinfer's paged MLA decode (gpu_kernels.mla_decode_flashinfer, when flashinfer is installed).

"auto" takes flashinfer for models of >= FLASHINFER_MIN_HEADS heads when it is importable, ours
otherwise (the measurements behind that line: docs/gpu-path.md, "Decode attention"). Error
against the float64 reference: ours ~3e-6 (bf16x2 products), flashinfer's ~4e-3 (bf16 queries
and probabilities).

A plan is per step: every layer's decode rows share the lengths and pages. Eager steps plan one
wrapper from the step's packed host indices; each CUDA graph bucket owns a wrapper whose fixed
buffers its graph reads, planned again from the staged indices before each replay.
"""

from __future__ import annotations

import logging

import torch

from hybrid.engine.config import ATTENTION_BACKENDS
from hybrid.errors import HybridError

log = logging.getLogger("hybrid.engine")

FLASHINFER_MIN_HEADS = 64  # "auto": below this ours measured as fast or faster


def resolve(choice: str, attention_ops: list) -> str:
    """The backend the engine runs ("triton" or "flashinfer") for `choice` and the model's
    attention operators. An explicit "flashinfer" that cannot run raises, naming why."""
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


class FlashInferPlans:
    """The flashinfer wrappers of one engine: one for eager steps, one per CUDA graph bucket."""

    def __init__(self, op, page_size: int, max_pages: int) -> None:
        """op: an MLAAttentionOp (every layer's match it: heads, dims, scale, cache dtype)."""
        from gpu_kernels.mla_decode_flashinfer import WORKSPACE_BYTES, FlashInferMLADecode

        # one scratch for every wrapper: steps run one after another on one stream
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=op.device)
        self._make = lambda **kw: FlashInferMLADecode(
            op.device, op.heads, op.kv_lora, op.rope, page_size, op.scale, op.kv_dtype,
            workspace=workspace, **kw)
        self.max_pages = max_pages
        self.eager = self._make()
        self._graphs: dict[int, object] = {}
        # one row over page 0 of a scratch cache: builds flashinfer's kernels now (JIT, nvcc),
        # so a build that fails fails at start-up, not in a request
        scratch = torch.zeros(page_size + 1, op.kv_lora + op.rope, dtype=op.kv_dtype,
                              device=op.device)
        self.eager.plan(torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
        q = torch.zeros(1, op.heads, op.kv_lora + op.rope, device=op.device)
        self.eager.run(q[..., :op.kv_lora], q[..., op.kv_lora:], scratch)
        log.info("decode attention: flashinfer (%s)", self.eager.backend)

    def for_graph(self, batch: int):
        """The wrapper a CUDA graph of `batch` decode rows captures (made once)."""
        if batch not in self._graphs:
            self._graphs[batch] = self._make(graph_batch=batch, max_pages=self.max_pages)
        return self._graphs[batch]

    def attach(self, fb, wrapper=None) -> None:
        """Plan `wrapper` (the eager one unless given) for fb's decode rows from their host
        page table and lengths (ForwardBatch.host_decodes), and let fb's attention use it; a
        batch without decode rows is left to ours (nothing to attend)."""
        if fb.num_decodes:
            wrapper = wrapper or self.eager
            wrapper.plan(*fb.host_decodes)
            fb.decode_attention = wrapper


def build(choice: str, attention_ops: list, page_size: int, max_pages: int
          ) -> tuple[str, FlashInferPlans | None]:
    """(the backend the engine runs, its FlashInferPlans or None). flashinfer failing to start
    (its kernels fail to build: no nvcc, an unsupported GPU) falls back to ours under "auto"
    with a warning, and raises naming the failure when asked for by name."""
    backend = resolve(choice, attention_ops)
    if backend == "triton":
        return backend, None
    try:
        return backend, FlashInferPlans(attention_ops[0], page_size, max_pages)
    except Exception as e:  # flashinfer's build and runtime errors vary
        if choice == "flashinfer":
            raise HybridError(f"flashinfer's MLA decode failed to start ({type(e).__name__}: "
                              f"{str(e)[:300]}); use --attention-backend triton") from e
        log.warning("flashinfer's MLA decode failed to start (%s: %s); decode attention runs "
                    "on ours (triton)", type(e).__name__, str(e)[:300])
        return "triton", None
