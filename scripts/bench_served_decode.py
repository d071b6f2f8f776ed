"""Served decode against the engine's own step rate, in one process: where the time between the
engine's step and the client's SSE event goes.

    python scripts/bench_served_decode.py [--gguf-path P] [--optimize-rules R] [--gen-len 128]
        [--repeats 3] [--ttft 512,2048,8192] [--mixed 8192] [--engine-thread main|worker]
        [--set NAME=VALUE] [--json FILE]

One model is loaded once, served by a real uvicorn on a bound loopback socket (as `hybrid
serve` runs it, with the same app), and the same single-stream greedy decode is timed four
ways, `--repeats` times each:
- `offline`: this thread steps the engine (as `hybrid.LLM` and bench_e2e.py do), before the
  worker thread and the server start;
- `engine`: the served engine (its loop on the main thread as in `hybrid serve`, or with
  `--engine-thread worker` on a thread started after loading), a request submitted with a sink
  that stamps each token (no event loop, no HTTP): the engine's step rate as served;
- `http`: a client streaming `/v1/completions` (the token-id prompt of `hybrid bench`,
  `logprobs: 0` so every token is its own SSE event) over loopback;
- `http+chat`: the same through `/v1/chat/completions`.
Reported: decode tokens/s (tokens after the first over the time after the first), median over
repeats, and the ratio http/engine. The ratio is the number: speed targets live here, not in
tests (tests/test_served_path.py runs this at a tiny size and checks the rows are there).
Without --gguf-path: the demo model with the machine's default rules.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import logging
import statistics
import sys
import threading
import time

import httpx


def _submit_stamped(state, prompt: list[int], gen_len: int):
    """One greedy request of gen_len tokens submitted to the served worker -> (request, token
    arrival times, an event set when it ends)."""
    from hybrid.engine.sampling.sampling_params import SamplingParams
    from hybrid.engine.scheduling.request import Request

    stamps: list[float] = []
    done = threading.Event()

    def sink(event) -> None:
        stamps.append(time.perf_counter())
        if getattr(event, "finish_reason", "failed") is not None:
            done.set()

    params = SamplingParams(temperature=0, max_tokens=gen_len, ignore_eos=True)
    request = Request(f"bench-{time.monotonic_ns()}", prompt, params, sink)
    state.worker.submit(request)
    return request, stamps, done


def _rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def offline_rate(state, prompt: list[int], gen_len: int) -> float:
    """Tokens/s after the first, this thread stepping the (not yet started) worker's engine."""
    request, stamps, _ = _submit_stamped(state, prompt, gen_len)
    while not request.is_finished:
        state.worker.step()
    return _rate(stamps)


def engine_rate(state, prompt: list[int], gen_len: int) -> float:
    """Tokens/s after the first of one request on the served worker, stamped in its sink."""
    _, stamps, done = _submit_stamped(state, prompt, gen_len)
    if not done.wait(600):
        raise RuntimeError("the engine did not finish")
    return _rate(stamps)


def http_rate(client: httpx.Client, url: str, model: str, prompt: list[int], gen_len: int,
              chat: bool) -> float:
    if chat:
        path, body = "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": gen_len, "logprobs": True, "top_logprobs": 0}
    else:
        path, body = "/v1/completions", {"prompt": prompt, "max_tokens": gen_len, "logprobs": 0}
    body.update(model=model, temperature=0, stream=True, ignore_eos=True)
    stamps = []
    with client.stream("POST", url + path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    if chat:
        stamps = stamps[1:]  # the role chunk comes before any token
    return _rate(stamps)


def http_ttft(client: httpx.Client, url: str, model: str, n: int, salt: int,
              vocab: int) -> float:
    """Seconds to the first streamed token of an n-token prompt new to the prefix cache."""
    return _first_token(client, url, model, n, salt, vocab)[0]


def _first_token(client: httpx.Client, url: str, model: str, n: int, salt: int,
                 vocab: int) -> tuple[float, str]:
    prompt = [1 + (salt * 7919 + j * 104729) % (vocab - 1) for j in range(n)]
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0,
            "stream": True}
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - t0, json.loads(line[6:])["choices"][0]["text"]
    raise RuntimeError("no token came back")


def _decode_stream(client: httpx.Client, url: str, model: str, prompt: list[int],
                   gen_len: int, stamps: list[float], texts: list[str]) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": gen_len, "temperature": 0,
            "stream": True, "ignore_eos": True, "logprobs": 0}
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
                texts.append(json.loads(line[6:])["choices"][0]["text"])


def mixed(client: httpx.Client, url: str, model: str, prompt: list[int], n: int,
          vocab: int, seed: int = 99, gen_len: int = 384) -> dict:
    """An n-token prompt arriving while one stream decodes: its TTFT, the decoding stream's
    inter-token gaps (p50, p99, max) over its whole run, and whether both requests' tokens
    equal the same requests run alone afterwards (greedy; the prompt's KV then comes from the
    prefix cache)."""
    stamps: list[float] = []
    texts: list[str] = []
    thread = threading.Thread(target=_decode_stream, args=(client, url, model, prompt,
                                                           gen_len, stamps, texts))
    thread.start()
    while len(stamps) < 64 and thread.is_alive():
        time.sleep(0.002)
    ttft, first = _first_token(client, url, model, n, seed, vocab)
    thread.join()
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
    alone: list[str] = []
    _decode_stream(client, url, model, prompt, gen_len, [], alone)
    first_alone = _first_token(client, url, model, n, seed, vocab)[1]
    return {"prompt": n, "ttft_s": ttft, "gap_p50_s": statistics.median(gaps),
            "gap_p99_s": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], "gap_max_s": gaps[-1],
            "same_first_token": first == first_alone, "same_stream_tokens": texts == alone}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--optimize-rules", default=None)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--ttft", default="", help="prompt lengths whose time to first token "
                    "through HTTP to measure too (median of --repeats), e.g. 512,2048,8192")
    ap.add_argument("--mixed", type=int, default=0, help="time a prompt of this many tokens "
                    "arriving while one stream decodes (its TTFT, the stream's gaps)")
    ap.add_argument("--engine-thread", choices=("main", "worker"), default="main",
                    help="the thread that steps the engine while serving: main (as hybrid "
                    "serve does) or a worker thread started after loading")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="an engine or server setting other than its default (e.g. "
                         "cpu_threads=14), as a Python literal; repeatable")
    args = ap.parse_args()

    from server.config import ServerConfig
    from server.inprocess import InProcessServer
    from server.serve import build_state

    # the engine's start-up choices (cost model, chunks) in the log; uvicorn stays quiet
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("hybrid.engine").setLevel(logging.INFO)
    settings = {"gguf_path": args.gguf_path, "optimize_rules": args.optimize_rules,
                "log_level": "warning"}
    for item in args.set:
        name, _, value = item.partition("=")
        settings[name] = ast.literal_eval(value)
    config = ServerConfig.from_flat(settings)
    t0 = time.perf_counter()
    state = build_state(config, start=False)
    print(f"loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    vocab = state.model.vocab_size
    prompt = [1 + (j * 104729) % min(1000, vocab - 1) for j in range(args.prompt_len)]
    rows: dict[str, list[float]] = {"offline": [], "engine": [], "http": [], "http+chat": []}
    offline_rate(state, prompt, 8)
    rows["offline"] = [offline_rate(state, prompt, args.gen_len) for _ in range(args.repeats)]
    server = InProcessServer(state)
    ttft: dict[int, float] = {}
    mix: dict = {}
    failure: list[BaseException] = []

    def client_side() -> None:
        try:
            with httpx.Client(timeout=600) as client:
                model = state.model.name
                http_rate(client, server.url, model, prompt, 8, chat=False)  # warm the routes
                http_rate(client, server.url, model, prompt, 8, chat=True)
                for _ in range(args.repeats):
                    rows["engine"].append(engine_rate(state, prompt, args.gen_len))
                    rows["http"].append(http_rate(client, server.url, model, prompt,
                                                  args.gen_len, chat=False))
                    rows["http+chat"].append(http_rate(client, server.url, model, prompt,
                                                       args.gen_len, chat=True))
                for n in (int(v) for v in args.ttft.split(",") if v):
                    ttft[n] = statistics.median(http_ttft(client, server.url, model, n, i,
                                                          vocab)
                                                for i in range(args.repeats))
                    print(f"TTFT {n}: {ttft[n]:.3f} s", file=sys.stderr, flush=True)
                if args.mixed:  # a new prompt each time (no prefix-cache hit): the median
                    runs = sorted((mixed(client, server.url, model, prompt, args.mixed, vocab,
                                         99 + i) for i in range(args.repeats)),
                                  key=lambda r: r["ttft_s"])
                    mix.update(runs[len(runs) // 2], runs=runs)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failure.append(e)
        finally:
            server.stop()

    # as `hybrid serve` runs: the engine's loop on this thread (the one that loaded it),
    # or, with --engine-thread worker, on a thread of its own (the old layout)
    client = threading.Thread(target=client_side)
    if args.engine_thread == "worker":
        state.worker.start()
        client.start()
    else:
        client.start()
        state.worker.run()
    client.join()
    if failure:
        raise failure[0]
    medians = {k: statistics.median(v) for k, v in rows.items()}
    result = {"gen_len": args.gen_len, "repeats": args.repeats, "settings": settings,
              "engine_thread": args.engine_thread,
              "tokens_per_s": rows,
              "median_tokens_per_s": medians,
              "ratio_http": medians["http"] / medians["engine"],
              "ratio_http_offline": medians["http"] / medians["offline"],
              "ratio_http_chat": medians["http+chat"] / medians["engine"], "ttft_s": ttft,
              "mixed": mix}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"| path | decode tok/s (median of {args.repeats}) | vs engine | vs offline |")
    print("|---|---|---|---|")
    for name, v in medians.items():
        print(f"| {name} | {v:.1f} | {v / medians['engine']:.3f} | "
              f"{v / medians['offline']:.3f} |")
    for n, v in ttft.items():
        print(f"| TTFT {n} tokens, s | {v:.3f} | | |")
    if mix:
        each = ", ".join(f"{r['ttft_s']:.3f}" for r in mix["runs"])
        print(f"| {mix['prompt']} tokens while 1 stream decodes: TTFT s (median of "
              f"{len(mix['runs'])}: {each}) | {mix['ttft_s']:.3f} "
              f"| gaps p50 / p99 / max ms | {1e3 * mix['gap_p50_s']:.1f} / "
              f"{1e3 * mix['gap_p99_s']:.1f} / {1e3 * mix['gap_max_s']:.1f} |")
        print(f"| tokens as alone: prompt's first {mix['same_first_token']}, stream's "
              f"{mix['same_stream_tokens']} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
