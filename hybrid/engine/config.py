"""`EngineConfig`: how the serving engine runs requests (the engine layer's one frozen config)."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.engine.prefill_costs import PREFILL_EXPERTS
from hybrid.errors import HybridError

DECODE_GRAPHS = ("auto", "step", "layers")
ATTENTION_BACKENDS = ("auto", "triton", "flashinfer")  # decode_attention.py


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the serving engine; `hybrid serve` reads its flag defaults from here.

    Each engine step runs one forward over the decode tokens of every running request plus
    prompt chunks of at most `chunk_size` tokens in all (continuous batching with chunked
    prefill; None: the runner chooses it at start-up, prefill_chunk.py). `max_batch_size` bounds the requests in flight at once; the rest queue FCFS.
    The latent KV cache holds `cache_lens` tokens in all, in pages of `page_size` tokens shared
    by every request; a request is admitted only once pages for its prompt plus its
    `max_tokens` are free. `cpu_threads` None lets the CPU expert kernels pick (physical cores
    minus one, at least one). `cuda_graphs` replays decode steps of up to `max_batch_size`
    requests as CUDA graphs captured at start-up (where the model runs on one CUDA device):
    `decode_graph` "step" captures a whole step as one graph, the GPU waiting on flags the CPU
    experts raise; "layers" captures the pieces between two MoE layers' CPU experts and the host
    replays them one by one; "auto" times one-request steps of both at start-up and keeps the
    faster (graph_choice.py). `prefill_experts` says where a step with prompt tokens runs each
    MoE layer's routed experts when they live on the CPU: "auto" streams a layer's experts to
    the GPU when the cost model measured at start-up says that beats the CPU for the step's
    token count, "cpu" never streams, "stream" always does; `stream_memory_gib` bounds the GPU
    memory the streaming buffers take (None: a whole layer's worth, within half the memory
    free after start-up). `attention_backend` picks the decode rows' attention kernel: "triton"
    ours, "flashinfer" flashinfer's paged MLA decode (installed apart), "auto" flashinfer where
    it measured faster (decode_attention.py).
    """

    gguf_path: str | None = None  # None: the built-in demo model
    optimize_rules: str | None = None  # None: the machine's default rule file
    max_batch_size: int = 16
    # prompt tokens per step; None: chosen at start-up (prefill_chunk.py: as large as activation
    # memory allows where prompt steps may stream experts to the GPU, else 512)
    chunk_size: int | None = None
    # prompt tokens per step while other requests decode; None: chosen at start-up from the
    # cost model (prefill_chunk.py: one layer of a long chunk passed beside decodes,
    # layered_prefill.py, must stay near a decode step's time)
    decode_chunk_size: int | None = None
    cache_lens: int = 32768
    page_size: int = 64
    cpu_threads: int | None = None
    cuda_graphs: bool = True  # replay decode steps as CUDA graphs (captured at start-up)
    decode_graph: str = "auto"  # "step": one graph a step; "layers": one a piece; "auto": timed
    prefill_experts: str = "auto"  # "auto" | "cpu" | "stream" (prefill_costs.py)
    stream_memory_gib: float | None = None  # GPU memory for streamed experts (None: auto)
    attention_backend: str = "auto"  # "auto" | "triton" | "flashinfer" (decode_attention.py)
    # a prompt chunk passed over steps beside decodes runs on a CUDA stream of its own, so the
    # GPU runs its layers while the host runs the decodes' CPU experts (model_runner.py)
    overlap_prefill: bool = True
    # fast mode's packed experts kept under ~/.cache/hybrid/packed and mapped on later starts
    packed_cache: bool = True
    # share the KV pages of equal prompt prefixes across requests (prefix_cache.py)
    prefix_cache: bool = True
    # count each MoE layer's expert choices (routing_recorder.py; hybrid profile/tune)
    record_routing: bool = False
    # run a rule file's devices elsewhere, e.g. "cuda=cpu": check a GPU layout on a CPU box
    device_map: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch_size <= 256:
            raise HybridError(f"max_batch_size must be between 1 and 256, got {self.max_batch_size}")
        if self.chunk_size is not None and not 1 <= self.chunk_size <= 1 << 20:
            raise HybridError(f"chunk_size must be between 1 and 1048576, got {self.chunk_size}")
        if self.decode_chunk_size is not None and self.decode_chunk_size < 1:
            raise HybridError(f"decode_chunk_size must be at least 1, got "
                              f"{self.decode_chunk_size}")
        if not 1 <= self.page_size <= 4096:
            raise HybridError(f"page_size must be between 1 and 4096, got {self.page_size}")
        if self.cache_lens < self.page_size:
            raise HybridError(f"cache_lens ({self.cache_lens}) must hold at least one page "
                              f"of page_size {self.page_size} tokens")
        if self.decode_graph not in DECODE_GRAPHS:
            raise HybridError(f"decode_graph must be one of {', '.join(DECODE_GRAPHS)}, got "
                              f"{self.decode_graph!r}")
        if self.prefill_experts not in PREFILL_EXPERTS:
            raise HybridError(f"prefill_experts must be one of {', '.join(PREFILL_EXPERTS)}, "
                              f"got {self.prefill_experts!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise HybridError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}"
                              f", got {self.attention_backend!r}")
        if self.stream_memory_gib is not None and not self.stream_memory_gib > 0:
            raise HybridError(f"stream_memory_gib must be positive, got {self.stream_memory_gib}")
        if self.device_map is not None:
            from hybrid.rules.devices import parse_device_map

            parse_device_map(self.device_map)  # a bad map fails here, before any loading
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise HybridError(f"cpu_threads must be at least 1, got {self.cpu_threads}")

    @property
    def num_pages(self) -> int:
        return self.cache_lens // self.page_size
