"""hybrid against llama.cpp's llama-server on the same GGUF, through HTTP, with the same client.

    python scripts/bench_serve_peer.py --gguf-path FILE [--llama-server PATH [--peer-args ...]]
        [--peer-url URL] [--only hybrid|peer] [--peer-json FILE] [--ttft 512,2048,8192,32768] [--streams 4,8,16,32] [--gen-len 64] [--repeats 3]
        [--rates 0.5,1] [--requests 32] [--itl-bound-ms 200] [--ttft-bound-s 5] [--json OUT]

Both servers start as a user starts them: `hybrid serve --gguf-path FILE` with its defaults, and
llama-server with the experts on the CPU (`-ngl 99 -ot exps=CPU`, slots for the most streams,
`--kv-unified`, flash attention; `--peer-args` replaces those); or `--peer-url` names a running
peer, and without either only hybrid is measured. One workload, one client (the official `openai`
package, streaming `/v1/completions` with token-id prompts, `ignore_eos`), each server alone on
the machine in turn:
- decode: one stream, tokens/s after the first token (median of `--repeats` streams);
- TTFT at each `--ttft` prompt length (prompts new to either prefix cache);
- aggregate: `--streams` concurrent streams, generated tokens/s over the wall time (median of
  `--repeats` runs);
- mixed: `--requests` requests with prompt and output lengths from a fixed-seed ShareGPT-like
  distribution (log-normal: prompts median 256 tokens up to 4096, outputs median 128 up to 512),
  arriving as a Poisson process at each `--rates` (requests/s): TTFT and inter-token gaps p50/p99,
  and goodput, the requests/s that met both bounds (TTFT <= `--ttft-bound-s`, their own p99 gap
  <= `--itl-bound-ms`).
Prints a markdown table (hybrid, peer, ratio) and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

from openai import APIConnectionError, AsyncOpenAI
from serve_process import ServerProcess, free_port


@dataclass
class Timing:
    """One streamed request: when it was sent, and each token's arrival."""

    sent: float
    stamps: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.sent

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


def _prompt(n: int, salt: int, vocab: int) -> list[int]:
    """n token ids no earlier request of this run began with (prefix caches see them new)."""
    rng = random.Random(salt)
    return [rng.randrange(100, vocab - 1) for _ in range(n)]


async def _stream(client: AsyncOpenAI, model: str, prompt: list[int], gen: int,
                  sampling: dict) -> Timing:
    """sampling: the request's temperature and top_p. A request the server dropped before
    any response is sent again once, its clock restarted (llama-server closes a keep-alive
    connection idle for 5 s, cpp-httplib's default, and a request the client's pool sends on
    it as it closes meets the close; the client itself retries nothing, max_retries=0, so no
    retry hides in a timing)."""
    for attempt in (1, 2):
        t = Timing(time.perf_counter())
        try:
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=gen, stream=True,
                extra_body={"ignore_eos": True}, **sampling)
            break
        except APIConnectionError:
            if attempt == 2:
                raise
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text is not None:
            t.stamps.append(time.perf_counter())
    if not t.stamps:
        raise RuntimeError("the server streamed no token")
    return t


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else math.nan


class Workload:
    def __init__(self, args: argparse.Namespace, vocab: int) -> None:
        self.args, self.vocab, self.salt = args, vocab, random.randrange(1 << 30)
        self.sampling = {"temperature": args.temperature, "top_p": args.top_p}

    def prompt(self, n: int) -> list[int]:
        self.salt += 1
        return _prompt(n, self.salt, self.vocab)

    @contextlib.asynccontextmanager
    async def connect(self, url: str):
        """-> (client, served model id), after one warm request (first-request costs)."""
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0,
                               timeout=1800) as client:
            model = (await client.models.list()).data[0].id
            await _stream(client, model, self.prompt(32), 8, self.sampling)
            yield client, model

    async def ttft_only(self, url: str, n: int) -> float:
        """The TTFT of one new n-token prompt."""
        async with self.connect(url) as (client, model):
            return (await _stream(client, model, self.prompt(n), 1, self.sampling)).ttft

    async def run(self, url: str, rows: dict, saved) -> dict:
        """Fills `rows` section by section, calling `saved()` after each (a run cut short by
        a time limit keeps what it measured)."""
        a = self.args
        async with self.connect(url) as (client, model):
            rows["model"] = model
            rows["decode_samples"] = []
            for _ in range(a.repeats):
                t = await _stream(client, model, self.prompt(32), a.gen_len, self.sampling)
                rows["decode_samples"].append((len(t.stamps) - 1) / (t.stamps[-1] - t.stamps[0]))
            rows["decode_tok_s"] = statistics.median(rows["decode_samples"])
            print(f"  decode: {rows['decode_tok_s']:.1f} tok/s (median of "
                  f"{', '.join(f'{v:.1f}' for v in rows['decode_samples'])})", file=sys.stderr,
                  flush=True)
            rows["ttft_s"] = {}
            saved()
            for n in a.ttft:
                t = await _stream(client, model, self.prompt(n), 1, self.sampling)
                rows["ttft_s"][n] = t.ttft
                print(f"  TTFT {n}: {rows['ttft_s'][n]:.3f} s", file=sys.stderr, flush=True)
                saved()
            rows["aggregate_tok_s"], rows["aggregate_samples"] = {}, {}
            for s in a.streams:
                samples = rows["aggregate_samples"][s] = []
                for _ in range(a.repeats):
                    start = time.perf_counter()
                    done = await asyncio.gather(*(_stream(client, model, self.prompt(32),
                                                          a.gen_len, self.sampling)
                                                  for _ in range(s)))
                    wall = time.perf_counter() - start
                    samples.append(sum(len(d.stamps) for d in done) / wall)
                rows["aggregate_tok_s"][s] = statistics.median(samples)
                print(f"  {s} streams: {rows['aggregate_tok_s'][s]:.1f} tok/s", file=sys.stderr,
                      flush=True)
                saved()
            rows["mixed"] = {}
            for r in a.rates:
                rows["mixed"][r] = await self.mixed(client, model, r)
                saved()
            return rows

    async def mixed(self, client: AsyncOpenAI, model: str, rate: float) -> dict:
        a = self.args
        rng = random.Random(1234)  # the same requests and arrivals for every server
        jobs = [(min(4096, max(4, int(rng.lognormvariate(math.log(256), 1.0)))),
                 min(512, max(4, int(rng.lognormvariate(math.log(128), 0.8)))),
                 rng.expovariate(rate)) for _ in range(a.requests)]
        start = time.perf_counter()

        async def one(prompt_len: int, gen: int, at: float) -> Timing:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            return await _stream(client, model, self.prompt(prompt_len), gen, self.sampling)

        arrivals, t = [], 0.0
        for p, g, gap in jobs:
            t += gap
            arrivals.append(one(p, g, t))
        timings = await asyncio.gather(*arrivals)
        wall = time.perf_counter() - start
        gaps = [g for x in timings for g in x.gaps]
        good = [x for x in timings if x.ttft <= a.ttft_bound_s
                and (not x.gaps or _pct(x.gaps, 0.99) <= a.itl_bound_ms / 1e3)]
        return {"rate": rate, "requests": len(timings), "wall_s": wall,
                "ttft_p50_s": _pct([x.ttft for x in timings], 0.5),
                "ttft_p99_s": _pct([x.ttft for x in timings], 0.99),
                "itl_p50_ms": 1e3 * _pct(gaps, 0.5), "itl_p99_ms": 1e3 * _pct(gaps, 0.99),
                "tok_s": sum(len(x.stamps) for x in timings) / wall,
                "goodput_req_s": len(good) / wall}


def _vocab(path: str) -> int:
    from hybrid.gguf.reader import GGUFModelFile

    return len(GGUFModelFile(path).get("tokenizer.ggml.tokens"))


class Report:
    """The rows measured so far, rewritten to `path` (if any) after every section."""

    def __init__(self, path: str | None, options: dict) -> None:
        self.path, self.data = path, {"hybrid": None, "peer": None, "options": options}

    def save(self) -> None:
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.data, f, indent=1)

    def measure(self, side: str, server: ServerProcess, workload: Workload, **extra) -> dict:
        print(f"{server.name}: up in {server.startup_s:.1f} s", file=sys.stderr, flush=True)
        rows = self.data[side] = {"startup_s": server.startup_s, **extra}
        try:
            asyncio.run(workload.run(server.url, rows, self.save))
        finally:
            server.stop()
            self.save()
        return rows


def _start_peer(args: argparse.Namespace, extra: str, log: str = "llama-server.log"
                ) -> ServerProcess:
    port = free_port()
    return ServerProcess([args.llama_server, "-m", args.gguf_path, "--port", str(port),
                          *extra.split()], "llama-server", port, os.path.join(args.logs, log))


def _try_peer(args: argparse.Namespace, workload: Workload, report: Report) -> str:
    """Each of --peer-try's argument sets started in turn and timed on one prompt of the
    largest --ttft length; returns the fastest (the settings that give the peer its best
    prefill, as a user tuning it would find)."""
    tries = report.data["peer_tries"] = []
    n = max(args.ttft)
    for i, extra in enumerate(x.strip() for x in args.peer_try.split("|") if x.strip()):
        server = _start_peer(args, extra, f"llama-server-try{i}.log")
        try:
            ttft = asyncio.run(workload.ttft_only(server.url, n))
        finally:
            server.stop()
        tries.append({"args": extra, "ttft_s": ttft, "tokens": n, "startup_s": server.startup_s})
        print(f"  llama-server {extra}: TTFT {n} = {ttft:.3f} s", file=sys.stderr, flush=True)
        report.save()
    best = min(tries, key=lambda t: t["ttft_s"])["args"]
    report.data["peer_best"] = best
    report.save()
    return best


def _table(ours: dict, peer: dict | None) -> list[str]:
    def row(name: str, a: float, b: float | None, fmt: str = "{:.1f}", lower: bool = False):
        ratio = "" if b is None or not a or not b else f"{(b / a if lower else a / b):.2f}x"
        return f"| {name} | {fmt.format(a)} | {'' if b is None else fmt.format(b)} | {ratio} |"

    p = peer or {}
    lines = ["| row | hybrid | llama-server | hybrid vs peer |", "|---|---|---|---|",
             row("start-up to /health, s", ours["startup_s"], p.get("startup_s"), lower=True),
             row("decode 1 stream, tok/s", ours["decode_tok_s"], p.get("decode_tok_s"))]
    for n, v in ours["ttft_s"].items():
        lines.append(row(f"TTFT {n} tokens, s", v, p.get("ttft_s", {}).get(n), "{:.3f}",
                         lower=True))
    for s, v in ours["aggregate_tok_s"].items():
        lines.append(row(f"{s} streams, tok/s", v, p.get("aggregate_tok_s", {}).get(s)))
    for r, m in ours["mixed"].items():
        q = p.get("mixed", {}).get(r, {})
        for key, label, fmt, lower in (("ttft_p50_s", "TTFT p50, s", "{:.3f}", True),
                                       ("ttft_p99_s", "TTFT p99, s", "{:.3f}", True),
                                       ("itl_p50_ms", "ITL p50, ms", "{:.1f}", True),
                                       ("itl_p99_ms", "ITL p99, ms", "{:.1f}", True),
                                       ("tok_s", "tok/s", "{:.1f}", False),
                                       ("goodput_req_s", "goodput, req/s", "{:.3f}", False)):
            lines.append(row(f"mixed {r} req/s: {label}", m[key], q.get(key), fmt, lower))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", required=True)
    ap.add_argument("--llama-server", default=None, help="the llama-server binary to start")
    ap.add_argument("--peer-args", default=None, help="llama-server's arguments after -m FILE "
                    "(default: -ngl 99 -ot exps=CPU -t CORES -np MAXSTREAMS -c CTX "
                    "--kv-unified -fa on)")
    ap.add_argument("--peer-try", default=None, help="argument sets for llama-server, '|' "
                    "between: each timed on the largest --ttft prompt, the fastest measured")
    ap.add_argument("--try-only", action="store_true", help="with --peer-try: stop after the "
                    "tries (the winner is in the JSON's peer_best)")
    ap.add_argument("--peer-url", default=None, help="a running peer instead of starting one")
    ap.add_argument("--hybrid-args", default="", help="extra `hybrid serve` flags (default none)")
    ap.add_argument("--ttft", default="512,2048,8192,32768")
    ap.add_argument("--streams", default="4,8,16,32")
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every request's (default greedy; chat clients send 0.6-1)")
    ap.add_argument("--top-p", type=float, default=1.0, help="every request's top_p")
    ap.add_argument("--repeats", type=int, default=3,
                    help="decode streams and runs of each --streams count; rows are medians "
                         "(docs/serving.md: one stream is too noisy on a shared host)")
    ap.add_argument("--rates", default="0.5,1")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--itl-bound-ms", type=float, default=200.0)
    ap.add_argument("--ttft-bound-s", type=float, default=5.0)
    ap.add_argument("--only", choices=("hybrid", "peer"), default=None,
                    help="measure one side (a lease too short for both: run each, then "
                         "--peer-json merges)")
    ap.add_argument("--peer-json", default=None, help="the peer's rows from an earlier --only "
                    "peer run's --json, shown beside hybrid's")
    ap.add_argument("--json", default=None, help="the rows, rewritten after every section")
    ap.add_argument("--logs", default="/tmp", help="folder for the servers' logs")
    args = ap.parse_args()
    args.ttft = [int(x) for x in args.ttft.split(",") if x]
    args.streams = [int(x) for x in args.streams.split(",") if x]
    args.rates = [float(x) for x in args.rates.split(",") if x]
    workload = Workload(args, _vocab(args.gguf_path))
    report = Report(args.json, {k: v for k, v in vars(args).items() if k != "json"})

    if args.only != "peer":
        port = free_port()
        hybrid = ServerProcess([sys.executable, "-m", "cli", "serve", "--gguf-path",
                                args.gguf_path, "--port", str(port), "--log-level", "warning",
                                *args.hybrid_args.split()],
                               "hybrid", port, os.path.join(args.logs, "hybrid-serve.log"))
        report.measure("hybrid", hybrid, workload)
    if args.peer_json:
        with open(args.peer_json) as f:
            report.data["peer"] = json.load(f)["peer"]
    elif args.only == "hybrid":
        pass
    elif args.peer_url:
        rows = report.data["peer"] = {"startup_s": math.nan}
        asyncio.run(workload.run(args.peer_url, rows, report.save))
    elif args.llama_server:
        ctx = max(65536, 2 * max(args.ttft, default=0))
        extra = args.peer_args or (f"-ngl 99 -ot exps=CPU -t {os.cpu_count()} "
                                   f"-np {max(args.streams, default=1)} -c {ctx} --kv-unified "
                                   f"-fa on")
        if args.peer_try:
            extra = _try_peer(args, workload, report)
            if args.try_only:
                print(json.dumps(report.data["peer_tries"], indent=1))
                return 0
        report.measure("peer", _start_peer(args, extra), workload, args=extra)
    ours, peer = report.data["hybrid"], report.data["peer"]
    if ours is not None:  # both as JSON has them (string keys), however they were made
        print("\n".join(_table(json.loads(json.dumps(ours)),
                                json.loads(json.dumps(peer)) if peer else None)))
    elif peer is not None:
        print(json.dumps(peer, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
