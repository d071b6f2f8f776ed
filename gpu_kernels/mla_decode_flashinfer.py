"""flashinfer's paged MLA decode on our latent cache: the optional peer of gpu_kernels.mla_decode.

Our cache is one tensor per layer, rows [slots + 1, C + R] (latent c, then the rotated key
k_r), page p holding rows p * page_size .. (p + 1) * page_size - 1. flashinfer's MLA wrapper
reads a latent cache [pages, page_size, C] and a rope cache [pages, page_size, R] through
their strides, so both are views of our tensor: no copy, nothing to keep in step.

flashinfer plans on the host (a work split per sequence from the lengths), then runs; so a
step's lengths must be known on the host before its launch (our scheduler knows them). The
arithmetic: queries in the cache's dtype (bf16), products and softmax in fp32, output in bf16
(ours: tf32 products, fp32 output). `pip install -e ".[flashinfer]"` installs it; it compiles
its kernels with nvcc at first use (JIT, cached under ~/.cache/flashinfer).
"""

from __future__ import annotations

import importlib.util
import warnings

import torch

WORKSPACE_BYTES = 128 * 2**20  # flashinfer's suggested float workspace (split partials)


def available() -> bool:
    """Whether flashinfer is importable here (CUDA is checked when a wrapper is made)."""
    return importlib.util.find_spec("flashinfer") is not None


def csr_pages(page_table: torch.Tensor, seq_lens: torch.Tensor,
              page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """page_table [B, P] int32, seq_lens [B] int32 (host) -> kv_indptr [B + 1], kv_indices
    [sum pages] int32: each sequence's first ceil(len / page_size) pages, one after another
    (flashinfer's CSR form of a page table)."""
    counts = (seq_lens.long() + page_size - 1) // page_size  # [B]
    if counts.numel() and int(counts.max()) > page_table.shape[1]:
        raise ValueError(f"a sequence of {int(seq_lens.max())} tokens needs more than the page "
                         f"table's {page_table.shape[1]} pages of {page_size}")
    indptr = torch.zeros(len(counts) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(counts, 0)
    keep = torch.arange(page_table.shape[1])[None, :] < counts[:, None]  # [B, P]
    return indptr, page_table.to(torch.int32).cpu()[keep]


class FlashInferMLADecode:
    """One wrapper per device, planned once per step (all layers share the plan: the same
    lengths and pages), run once per layer."""

    def __init__(self, device: torch.device, heads: int, kv_lora: int, rope: int,
                 page_size: int, scale: float, kv_dtype: torch.dtype = torch.bfloat16,
                 backend: str | None = None, graph_batch: int | None = None,
                 max_pages: int = 0, workspace: torch.Tensor | None = None) -> None:
        """graph_batch: plan for a CUDA graph of that many rows (fixed buffers that the graph
        reads and each plan rewrites; `max_pages` bounds the pages of one row). workspace:
        WORKSPACE_BYTES of uint8 to share with wrappers that never run at the same time."""
        if not available():
            raise ImportError("the flashinfer attention backend needs flashinfer: "
                              "pip install -e \".[flashinfer]\" (CUDA only)")
        if torch.device(device).type != "cuda":
            raise ValueError(f"flashinfer runs on CUDA devices only, not {device}")
        if kv_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"flashinfer's MLA decode reads a bf16 or f16 cache, not {kv_dtype}")
        import flashinfer.mla

        self.heads, self.kv_lora, self.rope = heads, kv_lora, rope
        self.page_size, self.scale, self.kv_dtype = page_size, scale, kv_dtype
        self.device = torch.device(device)
        if workspace is None:
            workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        buffers = {}
        if graph_batch is not None:
            i32 = {"dtype": torch.int32, "device": self.device}
            buffers = {"use_cuda_graph": True,
                       "qo_indptr": torch.arange(graph_batch + 1, **i32),
                       "kv_indptr": torch.zeros(graph_batch + 1, **i32),
                       "kv_indices": torch.zeros(max(graph_batch * max_pages, 1), **i32),
                       "kv_len_arr": torch.ones(graph_batch, **i32)}
        if backend is None:  # Hopper's own kernels where there are some (measured faster)
            backend = "fa3" if torch.cuda.get_device_capability(self.device)[0] == 9 else "fa2"
        self.backend = backend
        self._wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend=backend,
                                                                     **buffers)

    def plan(self, page_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """page_table [B, P], seq_lens [B] (tensors or numpy arrays; on the host saves a sync)
        for the next runs. A padding row (length 0) is planned as one token of its first page:
        its output row means nothing."""
        lens = torch.as_tensor(seq_lens).to(torch.int32).cpu().clamp(min=1)
        indptr, indices = csr_pages(torch.as_tensor(page_table), lens, self.page_size)
        qo_indptr = torch.arange(len(lens) + 1, dtype=torch.int32)  # one query token per sequence
        with warnings.catch_warnings():  # newer flashinfer prefers a metadata object
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            self._wrapper.plan(qo_indptr, indptr, indices.to(self.device), lens, self.heads,
                               self.kv_lora, self.rope, self.page_size, False, self.scale,
                               self.kv_dtype, self.kv_dtype)

    def run(self, q_lat: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """q_lat [B, H, C], q_rope [B, H, R] (any float dtype), cache [slots + 1, C + R] ->
        out [B, H, C] fp32, for the planned batch."""
        c, r, ps = self.kv_lora, self.rope, self.page_size
        pages = (cache.shape[0] - 1) // ps
        paged = cache[: pages * ps].view(pages, ps, c + r)  # [pages, ps, C + R]
        q_nope = q_lat.to(self.kv_dtype).contiguous()
        q_pe = q_rope.to(self.kv_dtype).contiguous()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            o = self._wrapper.run(q_nope, q_pe, paged[..., :c], paged[..., c:])  # [B, H, C]
        if out is None:
            return o.float()
        out.copy_(o)
        return out
