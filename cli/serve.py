"""`hybrid serve` and `hybrid bench`: their flags (serve's made from the fields of
`EngineConfig` and `ServerConfig`, bench's defaults read from `BenchOptions`) and commands."""

from __future__ import annotations

import argparse
from dataclasses import fields


def cmd_serve(args: argparse.Namespace) -> int:
    from cli.progress import progress_bar
    from server.config import ServerConfig
    from server.serve import serve

    config = ServerConfig.from_flat({name: getattr(args, name) for name in args.settings})
    return serve(config, progress=progress_bar("loading"))


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    from cli.flags import add_flags
    from hybrid.engine.config import EngineConfig
    from server.config import ServerConfig

    p = sub.add_parser("serve", help="serve OpenAI- and Ollama-compatible APIs "
                                     "(/v1/chat/completions, /api/chat, ...) and /metrics")
    # every flag is a declared field of the engine's or the server's config (hybrid/settings.py)
    names = add_flags(p, EngineConfig, ServerConfig)
    p.set_defaults(func=cmd_serve, settings=tuple(names))


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
