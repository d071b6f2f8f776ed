"""`hybrid serve` and `hybrid bench`: their flags (defaults read from `ServerConfig`,
`EngineConfig` and `BenchOptions`) and commands."""

from __future__ import annotations

import argparse
from dataclasses import fields

# Engine and server settings `hybrid serve` takes as flags; each is a field of EngineConfig or
# ServerConfig, passed by name to `ServerConfig.from_flat`.
SERVE_SETTINGS = ("gguf_path", "optimize_rules", "max_batch_size", "chunk_size",
                  "decode_chunk_size", "cache_lens",
                  "page_size", "cpu_threads", "host", "port", "max_new_tokens", "api_key",
                  "served_model_name", "max_request_bytes", "log_level", "force_think",
                  "cuda_graphs", "decode_graph", "prefill_experts", "stream_memory_gib",
                  "overlap_prefill",
                  "attention_backend",
                  "packed_cache", "prefix_cache", "chat_template", "routing_profile", "device_map",
                  "lenient_schemas", "shutdown_timeout")


def cmd_serve(args: argparse.Namespace) -> int:
    from server.cli import progress_bar
    from server.config import ServerConfig
    from server.serve import serve

    config = ServerConfig.from_flat({name: getattr(args, name) for name in SERVE_SETTINGS})
    return serve(config, progress=progress_bar("loading"))


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from hybrid.engine.config import ATTENTION_BACKENDS, DECODE_GRAPHS, EngineConfig
    from hybrid.engine.prefill_costs import PREFILL_EXPERTS
    from hybrid.tokenizer.bundled_templates import BUNDLED_TEMPLATES
    from server.config import LOG_LEVELS, ServerConfig

    e = {f.name: f.default for f in fields(EngineConfig)}
    d = {f.name: f.default for f in fields(ServerConfig)}
    p = sub.add_parser("serve", help="serve OpenAI- and Ollama-compatible APIs "
                                     "(/v1/chat/completions, /api/chat, ...) and /metrics")
    p.add_argument("--gguf-path", default=e["gguf_path"],
                   help="a .gguf file, split part or folder (default: the built-in demo model)")
    p.add_argument("--optimize-rules", default=e["optimize_rules"],
                   help="bundled rule file name or path (default: cpu.yaml without a GPU)")
    p.add_argument("--host", default=d["host"], help="address to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=d["port"],
                   help="TCP port to listen on (0: any free port, printed at start)")
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"],
                   help="cap on tokens per request; larger max_tokens are clamped to it")
    p.add_argument("--max-batch-size", type=int, default=e["max_batch_size"],
                   help="requests in flight at once, run together in one batched forward per "
                        "step (the rest queue FCFS)")
    p.add_argument("--chunk-size", type=int, default=e["chunk_size"],
                   help="prompt tokens prefilled per step, across requests (chunked prefill; "
                        "default: chosen at start-up, as large as activation memory allows up "
                        "to 8192 where prompt steps stream experts to the GPU, else 512)")
    p.add_argument("--decode-chunk-size", type=int, default=e["decode_chunk_size"],
                   help="prompt tokens per step while other requests decode (their inter-token "
                        "latency grows with it; default: chosen at start-up, the most whose one "
                        "streamed layer costs at most 2 decode steps, else the chunk size)")
    p.add_argument("--cache-lens", type=int, default=e["cache_lens"],
                   help="tokens the paged KV cache holds, over all requests")
    p.add_argument("--page-size", type=int, default=e["page_size"],
                   help="tokens per KV cache page")
    p.add_argument("--cpu-threads", type=int, default=e["cpu_threads"],
                   help="threads of the CPU expert kernels (default: physical cores minus one)")
    p.add_argument("--no-cuda-graph", dest="cuda_graphs", action="store_false",
                   default=e["cuda_graphs"],
                   help="run decode steps eagerly instead of replaying CUDA graphs captured at "
                        "start-up (one set per batch size up to --max-batch-size)")
    p.add_argument("--decode-graph", choices=list(DECODE_GRAPHS), default=e["decode_graph"],
                   help="step: a decode step is one CUDA graph, the GPU waiting on flags the "
                        "CPU experts raise; layers: one graph per stretch between two MoE "
                        "layers' CPU experts, replayed by the host; auto: time both at "
                        "start-up and keep the faster")
    p.add_argument("--prefill-experts", choices=list(PREFILL_EXPERTS),
                   default=e["prefill_experts"],
                   help="where prompt steps run the CPU-placed routed experts: auto streams a "
                        "layer's experts to the GPU over PCIe when the cost model measured at "
                        "start-up says that beats the CPU for the step's tokens; cpu never; "
                        "stream always")
    p.add_argument("--stream-memory-gib", type=float, default=e["stream_memory_gib"],
                   help="GPU memory for streamed experts (default: a whole layer's worth, "
                        "within half the memory free after start-up)")
    p.add_argument("--no-overlap-prefill", dest="overlap_prefill", action="store_false",
                   default=e["overlap_prefill"],
                   help="run a long prompt's layers after the decoding requests' step instead "
                        "of on a CUDA stream of its own beside their CPU experts")
    p.add_argument("--attention-backend", choices=list(ATTENTION_BACKENDS),
                   default=e["attention_backend"],
                   help="the decode attention kernel: triton (ours), flashinfer (its paged MLA "
                        "decode; pip install -e \".[flashinfer]\"), auto: flashinfer for models "
                        "of 64 or more heads when it is installed, where it measured faster")
    p.add_argument("--no-packed-cache", dest="packed_cache", action="store_false",
                   default=e["packed_cache"],
                   help="pack fast mode's CPU experts in memory on every start instead of "
                        "keeping the packed copy on disk ($HYBRID_PACKED_CACHE_DIR, default "
                        "~/.cache/hybrid/packed) and memory-mapping it on the next start")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   default=e["prefix_cache"],
                   help="prefill every prompt whole instead of reusing the KV pages of prompt "
                        "prefixes earlier requests computed (a chat's history, a shared "
                        "system prompt)")
    p.add_argument("--api-key", default=d["api_key"],
                   help="require 'Authorization: Bearer KEY' on every route but /health")
    p.add_argument("--served-model-name", default=d["served_model_name"],
                   help="the model name clients pass (default: the GGUF file's stem)")
    p.add_argument("--max-request-bytes", type=int, default=d["max_request_bytes"],
                   help="larger request bodies get a 413")
    p.add_argument("--log-level", default=d["log_level"], choices=list(LOG_LEVELS),
                   help="the server's and the engine's log level")
    p.add_argument("--force-think", action="store_true", default=d["force_think"],
                   help="end chat prompts with '<think>\\n' (DeepSeek R1): the model reasons "
                        "first; chat replies carry it apart (reasoning_content)")
    p.add_argument("--chat-template", default=d["chat_template"], metavar="NAME|FILE",
                   help="replace the file's chat template with a bundled family's ("
                        + ", ".join(BUNDLED_TEMPLATES) + ") or a .jinja file")
    p.add_argument("--lenient-schemas", action="store_true", default=d["lenient_schemas"],
                   help="let structured output and tool calls write object keys their JSON "
                        "schema does not list where it does not forbid them (as JSON Schema "
                        "reads it); by default they write none, as vLLM and SGLang do")
    p.add_argument("--shutdown-timeout", type=float, default=d["shutdown_timeout"],
                   metavar="S", help="on SIGTERM or Ctrl-C: new requests get a 503 while the "
                   "running ones have S seconds to finish; then they are cancelled")
    p.add_argument("--record-routing", dest="routing_profile", default=d["routing_profile"],
                   metavar="FILE", help="record which experts the traffic uses into FILE (a "
                   "routing profile for `hybrid tune`, rewritten every 30 s)")
    p.add_argument("--device-map", default=e["device_map"], metavar="FROM=TO",
                   help="run the rule file's devices elsewhere, e.g. cuda=cpu: try a GPU layout "
                        "(a tuned one) on a machine without the GPU")
    p.set_defaults(func=cmd_serve)


def cmd_bench(args: argparse.Namespace) -> int:
    from server.bench import BenchOptions, render, run_bench, to_json

    opts = BenchOptions(args.url, args.concurrency, args.prompt_len, args.gen_len,
                        args.num_requests, args.model, args.api_key)
    result = run_bench(opts, progress=not args.json)
    print(to_json(result) if args.json else render(result))
    return 0


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from server.bench import BenchOptions

    d = {f.name: f.default for f in fields(BenchOptions)}
    p = sub.add_parser("bench", help="load a running server with concurrent streams")
    p.add_argument("--url", default=d["url"], help="the server's base URL (without /v1)")
    p.add_argument("--concurrency", type=int, default=d["concurrency"],
                   help="streams in flight at once")
    p.add_argument("--prompt-len", type=int, default=d["prompt_len"], help="prompt tokens")
    p.add_argument("--gen-len", type=int, default=d["gen_len"], help="tokens per request")
    p.add_argument("--num-requests", type=int, default=d["num_requests"],
                   help="requests in all")
    p.add_argument("--model", default=d["model"], help="default: the server's first model")
    p.add_argument("--api-key", default=d["api_key"], help="the server's API key, if it has one")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench)
