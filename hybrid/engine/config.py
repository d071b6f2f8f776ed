"""`EngineConfig`: how the serving engine runs requests (the engine layer's one frozen config)."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.errors import HybridError
from hybrid.model.kv_budget import DEFAULT_CACHE_LENS, DEFAULT_MAX_BATCH_SIZE
from hybrid.settings import check_choices, setting

DECODE_GRAPHS = ("auto", "step", "layers")
ATTENTION_BACKENDS = ("auto", "triton", "flashinfer")  # attention/select.py
PREFILL_EXPERTS = ("auto", "cpu", "stream")  # prefill/prefill_costs.py
OVERLAP_DECODE = ("auto", "on", "off")  # engine.py


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the serving engine, each declared once with the help its `hybrid serve` flag
    shows (hybrid/settings.py).

    Each engine step runs one forward over the decode tokens of every running request plus
    prompt chunks of at most `chunk_size` tokens in all (continuous batching with chunked
    prefill); `max_batch_size` bounds the requests in flight at once, the rest queue FCFS. The
    latent KV cache holds `cache_lens` tokens in all, in pages of `page_size` tokens shared by
    every request; a request is admitted only once pages for its prompt plus its `max_tokens`
    are free. CUDA graphs are captured where the model runs on one CUDA device.
    """

    gguf_path: str | None = setting(
        None, help="a .gguf file, split part or folder (default: the built-in demo model)")
    optimize_rules: str | None = setting(
        None, help="bundled rule file name or path (default: cpu.yaml without a GPU)")
    max_batch_size: int = setting(
        DEFAULT_MAX_BATCH_SIZE, help="requests in flight at once, run together in one batched forward per step "
                 "(the rest queue FCFS)")
    chunk_size: int | None = setting(
        None, help="prompt tokens prefilled per step, across requests (chunked prefill; "
                   "default: chosen at start-up, as large as activation memory allows up to "
                   "8192 where prompt steps stream experts to the GPU, else 512)")
    decode_chunk_size: int | None = setting(
        None, help="prompt tokens per step while other requests decode (their inter-token "
                   "latency grows with it; default: chosen at start-up, the most whose one "
                   "streamed layer fits --decode-gap, else the chunk size)")
    decode_gap: float = setting(
        3.0, metavar="X",
        help="how long a step may grow, in decode steps, while a long prompt passes the layers "
             "beside decoding requests (their longest inter-token gap against the usual one), "
             "counted as if the prompt's share ran after the decode; it runs beside it, so the "
             "gaps measure less (docs/serving.md). Sets the prompt tokens and layers such a "
             "step takes: more finishes the prompt sooner. The default keeps a decoding "
             "stream's longest gaps within 3x its usual one even where nothing overlaps")
    cache_lens: int | None = setting(
        None, help="tokens the paged KV cache holds, over all requests (default: chosen at "
                   "start-up: 32768, or up to the model's whole context where a third of the "
                   "GPU memory free after the weights holds it)")
    page_size: int = setting(64, help="tokens per KV cache page")
    cpu_threads: int | None = setting(
        None, help="threads of the CPU expert kernels (default: physical cores minus one)")
    compile_threads: int | None = setting(
        None, help="threads compiling the GPU's Triton kernels at start-up, side by side "
                   "(default: one a core; 1: each as a warm-up step first launches it)")
    cuda_graphs: bool = setting(
        True, flag="--no-cuda-graph",
        help="run decode steps eagerly instead of replaying CUDA graphs captured at start-up "
             "(one set per batch size up to --max-batch-size)")
    decode_graph: str = setting(
        "auto", choices=DECODE_GRAPHS,
        help="step: a decode step is one CUDA graph, the GPU waiting on flags the CPU experts "
             "raise; layers: one graph per stretch between two MoE layers' CPU experts, "
             "replayed by the host; auto: time both at start-up and keep the faster "
             "(hybrid/engine/graphs/choice.py)")
    overlap_decode: str = setting(
        "auto", choices=OVERLAP_DECODE,
        help="auto: while every running request decodes greedily on whole-step CUDA graphs, "
             "schedule and launch each step beside the CPU experts of the one before, its "
             "input tokens read on the GPU from that step's picks (a request that stops "
             "computes one token more, dropped); off: each step's tokens are read back before "
             "the next is scheduled; on: eager steps too (no gain there: it tests the logic on "
             "the CPU)")
    prefill_experts: str = setting(
        "auto", choices=PREFILL_EXPERTS,
        help="where prompt steps run the CPU-placed routed experts: auto streams a layer's "
             "experts to the GPU over PCIe when the cost model measured at start-up says that "
             "beats the CPU for the step's tokens; cpu never; stream always")
    stream_memory_gib: float | None = setting(
        None, help="GPU memory for streamed experts (default: a whole layer's worth, within "
                   "half the memory free after start-up)")
    overlap_prefill: bool = setting(
        True, help="run a long prompt's layers after the decoding requests' step instead of "
                   "on a CUDA stream of its own beside their CPU experts")
    dense_prefill: bool = setting(
        True, help="multiply a long prompt's streamed experts on the tiles that decode each "
                   "weight per block of tokens, instead of on their weights decoded once into "
                   "fp16 (fast mode; the decoded tensor takes GPU memory beside the stream)")
    attention_backend: str = setting(
        "auto", choices=ATTENTION_BACKENDS,
        help="the decode attention kernel: triton (ours), flashinfer (its paged MLA decode; "
             "pip install -e \".[flashinfer]\"), auto: flashinfer for models of 64 or more heads "
             "when it is installed, where it measured faster")
    packed_cache: bool = setting(
        True, help="pack fast mode's CPU experts in memory on every start instead of keeping "
                   "the packed copy on disk ($HYBRID_PACKED_CACHE_DIR, default "
                   "~/.cache/hybrid/packed) and memory-mapping it on the next start")
    prefix_cache: bool = setting(
        True, help="prefill every prompt whole instead of reusing the KV pages of prompt "
                   "prefixes earlier requests computed (a chat's history, a shared system "
                   "prompt)")
    # count each MoE layer's expert choices (routing_recorder.py; serve's --record-routing)
    record_routing: bool = False
    device_map: str | None = setting(
        None, metavar="FROM=TO",
        help="run the rule file's devices elsewhere, e.g. cuda=cpu: try a GPU layout (a tuned "
             "one) on a machine without the GPU")

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch_size <= 256:
            raise HybridError(f"max_batch_size must be between 1 and 256, got {self.max_batch_size}")
        if self.chunk_size is not None and not 1 <= self.chunk_size <= 1 << 20:
            raise HybridError(f"chunk_size must be between 1 and 1048576, got {self.chunk_size}")
        if self.decode_chunk_size is not None and self.decode_chunk_size < 1:
            raise HybridError(f"decode_chunk_size must be at least 1, got "
                              f"{self.decode_chunk_size}")
        if not self.decode_gap > 1:
            raise HybridError(f"decode_gap must be above 1 (a step beside a long prompt takes "
                              f"the decode step and a share of the prompt), got {self.decode_gap}")
        if not 1 <= self.page_size <= 4096:
            raise HybridError(f"page_size must be between 1 and 4096, got {self.page_size}")
        if self.cache_lens is not None and self.cache_lens < self.page_size:
            raise HybridError(f"cache_lens ({self.cache_lens}) must hold at least one page "
                              f"of page_size {self.page_size} tokens")
        check_choices(self)
        if self.stream_memory_gib is not None and not self.stream_memory_gib > 0:
            raise HybridError(f"stream_memory_gib must be positive, got {self.stream_memory_gib}")
        if self.device_map is not None:
            from hybrid.rules.devices import parse_device_map

            parse_device_map(self.device_map)  # a bad map fails here, before any loading
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise HybridError(f"cpu_threads must be at least 1, got {self.cpu_threads}")
        if self.compile_threads is not None and self.compile_threads < 1:
            raise HybridError(f"compile_threads must be at least 1, got "
                              f"{self.compile_threads}")

    @property
    def prompt_share(self) -> float:
        """The time, in one-token decode steps (their CPU experts where no step was timed),
        that a long prompt's share may add to a step beside decodes: the step then stays within
        `decode_gap` decode steps even where the prompt's share runs after the decodes instead
        of beside them."""
        return self.decode_gap - 1

    @property
    def num_pages(self) -> int:
        """Pages of the cache: of cache_lens as the engine chose it (Engine.config), or of
        DEFAULT_CACHE_LENS where it is still open (a scheduler built alone)."""
        return (self.cache_lens or DEFAULT_CACHE_LENS) // self.page_size
