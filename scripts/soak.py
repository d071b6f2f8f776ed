"""Soak a running server: N concurrent clients for T minutes of mixed traffic, then check it.

    python scripts/soak.py --url http://127.0.0.1:8000 [--api-key KEY] [--clients 64]
        [--minutes 10] [--seed 0] [--pid PID] [--max-replays 400] [--json OUT]

Each client draws its requests from a fixed-seed mix, through the official `openai` client and
raw HTTP: chat and completions, streaming and not, `n` > 1, seeded samples with the filters and
penalties chat clients send, stop strings, logprobs and top_logprobs, tools with tool_choice
auto/required/named, json_schema and json_object, long and short prompts over a few shared
prefixes (the prefix cache), 10% clients that disconnect mid-stream, 5% malformed or oversized
bodies. Then, with the server idle, it checks and prints:
- no 5xx answer (4xx only for the malformed bodies);
- every greedy request's tokens equal the same request run alone afterwards (no cross-talk
  between batched requests) or part from it only at a near-tie (`--tie` nats: how the GPU's
  batched sums may differ, see soak_replay.py), every seeded sample the same on two runs alone
  (a fixed-seed sample of --max-replays of them: all of a long run alone outlasts the run);
- KV pages held by requests back to 0, nothing running or queued, and /health's counters moved
  by what the clients sent (requests admitted = finished + cancelled + failed);
- with --pid (the server's process), its RSS growth from the first minute (a tenth of the run
  when shorter) to the end (<= 2%), after a warm-up pass of every kind of request; where
  nvidia-smi sees the process, its GPU memory growth over the same span (<= 2%).
It reports the requests sent by kind, the tokens the server generated and prefilled, and the
disconnects.
Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import openai
from soak_replay import replay_alone, steps_of, texts

CLUSTER_PUSH_S = 1.5  # longer than a replica's push period (server/replicas/deployment.py)
PREFIXES = ["You are a terse assistant. " * 12, "Summarize the following notes. " * 20,
            "Answer in one word. " * 6]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}},
             "required": ["zone"]}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "n": {"type": "integer", "minimum": 0,
                                                 "maximum": 99}},
          "required": ["name", "n"]}
KINDS = (("chat", 20), ("chat_stream", 15), ("completion", 10), ("completion_stream", 10),
         ("n_seeded", 8), ("sampled", 6), ("stop", 6), ("logprobs", 8), ("tools", 8),
         ("schema", 5), ("long", 5), ("disconnect", 10), ("malformed", 5))


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    by_kind: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    engine_requests: int = 0  # choices the server admitted (disconnects included)
    # (path, body, result, the response's id)
    replays: list[tuple[str, dict, object, str | None]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, kind: str, status: int, engine: int = 0) -> None:
        with self.lock:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.engine_requests += engine


class Client:
    def __init__(self, url: str, key: str, model: str, rng: random.Random, tally: Tally) -> None:
        self.url, self.model, self.rng, self.tally = url, model, rng, tally
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=600)
        self.oai = openai.OpenAI(base_url=f"{url}/v1", api_key=key or "none", max_retries=0,
                                 timeout=600)

    def messages(self, long: bool = False) -> list[dict]:
        prefix = self.rng.choice(PREFIXES) * (8 if long else 1)
        return [{"role": "system", "content": prefix},
                {"role": "user", "content": f"Question {self.rng.randrange(10**6)}?"}]

    def one(self, kind: str) -> None:
        r, base = self.rng, {"model": self.model, "max_tokens": self.rng.randint(4, 24)}
        chat = {**base, "messages": self.messages(), "temperature": 0}
        if kind in ("chat", "long", "stop", "tools", "schema"):
            if kind == "long":
                chat["messages"] = self.messages(long=True)
            if kind == "stop":
                chat["stop"] = [" the", "\n"]
            if kind == "tools":
                chat["tools"] = TOOLS
                chat["tool_choice"] = r.choice(["auto", "required", {
                    "type": "function", "function": {"name": "get_time"}}])
            if kind == "schema":
                chat["response_format"] = r.choice([{"type": "json_object"}, {
                    "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}])
                chat["max_tokens"] = 60
            self._replayable(kind, "/v1/chat/completions", chat, 1)
        elif kind == "chat_stream":
            stream = list(self.oai.chat.completions.create(**chat, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            self.tally.add(kind, 200, 1)
            self._remember("/v1/chat/completions", chat, text, stream[0].id if stream else None)
        elif kind in ("completion", "completion_stream", "logprobs"):
            body = {**base, "prompt": self.rng.choice(PREFIXES)[:80] + str(r.randrange(999)),
                    "temperature": 0}
            if kind == "logprobs":
                body["logprobs"] = 3
            if kind == "completion_stream":
                out = list(self.oai.completions.create(**body, stream=True))
                text = "".join(c.choices[0].text for c in out if c.choices)
                self.tally.add(kind, 200, 1)
                self._remember("/v1/completions", body, text, out[0].id if out else None)
            else:
                self._replayable(kind, "/v1/completions", body, 1)
        elif kind == "n_seeded":
            body = {**chat, "temperature": 0.9, "n": 2, "seed": r.randrange(1 << 30)}
            self._replayable(kind, "/v1/chat/completions", body, 2)
        elif kind == "sampled":  # what chat clients send: filters and penalties, seeded
            body = {**chat, "temperature": r.choice([0.6, 0.8, 1.0]), "top_p": 0.95,
                    "seed": r.randrange(1 << 30), "presence_penalty": r.choice([0, 0.5]),
                    "frequency_penalty": r.choice([0, 0.3])}
            if r.random() < 0.5:
                body.update(top_k=40, repetition_penalty=1.1, min_p=0.05)
            self._replayable(kind, "/v1/chat/completions", body, 1)
        elif kind == "disconnect":
            body = {**chat, "max_tokens": 200, "stream": True}
            with self.http.stream("POST", "/v1/chat/completions", json=body) as s:
                for i, _ in enumerate(s.iter_lines()):
                    if i >= 3:
                        break  # closing the response here cancels the request
                status = s.status_code
            self.tally.add(kind, status, 1)
        elif kind == "malformed":
            bad = r.choice([b"{not json", json.dumps({**chat, "frobnicate": 1}).encode(),
                            json.dumps({**chat, "messages": []}).encode(),
                            b'{"model": "x", "messages": "' + b"a" * (2 << 20) + b'"}'])
            resp = self.http.post("/v1/chat/completions", content=bad,
                                  headers={"Content-Type": "application/json"})
            self.tally.add(kind, resp.status_code)
            if resp.status_code < 400 or resp.status_code >= 500:
                self.tally.failures.append(f"malformed body answered {resp.status_code}")

    def _replayable(self, kind: str, path: str, body: dict, choices: int) -> None:
        resp = self.http.post(path, json=body)
        self.tally.add(kind, resp.status_code, choices if resp.status_code == 200 else 0)
        if resp.status_code != 200:
            self.tally.failures.append(f"{kind}: {resp.status_code} {resp.text[:200]}")
            return
        self._remember(path, body, texts(resp.json()), resp.json().get("id"))

    def _remember(self, path: str, body: dict, result: object, response_id: str | None) -> None:
        with self.tally.lock:
            self.tally.replays.append((path, body, result, response_id))


def run(args: argparse.Namespace) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = httpx.get(f"{args.url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
    before = _health(args.url)
    tally = Tally()
    kinds, weights = zip(*KINDS, strict=True)
    # every kind once first: one-time costs (the grammar vocabulary, kernels for new shapes)
    # land before the memory baseline and the clock
    warm = Client(args.url, args.api_key, model, random.Random(args.seed - 1), tally)
    for kind in kinds:
        try:
            warm.one(kind)
        except (httpx.HTTPError, openai.APIError) as e:
            tally.failures.append(f"warm-up {kind}: {type(e).__name__}: {e}"[:300])
    rss: list[float] = []
    gpu: list[float] = []
    stop_at = time.monotonic() + 60 * args.minutes

    def client_loop(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        c = Client(args.url, args.api_key, model, rng, tally)
        while time.monotonic() < stop_at:
            kind = rng.choices(kinds, weights)[0]
            try:
                c.one(kind)
            except (httpx.HTTPError, openai.APIError) as e:
                tally.add(kind, getattr(e, "status_code", 599))
                tally.failures.append(f"{kind}: {type(e).__name__}: {e}"[:300])

    def sample_rss() -> None:
        import psutil

        proc = psutil.Process(args.pid)
        settle = time.monotonic() + min(60.0, 10 * args.minutes)  # the first batches' growth
        while time.monotonic() < stop_at:
            if time.monotonic() >= settle:
                rss.append(proc.memory_info().rss)
                if (used := _gpu_mib(args.pid)) is not None:
                    gpu.append(used)
            time.sleep(0.5)

    def report() -> None:  # a line a minute: a run cut short still says how far it got
        started = time.monotonic()
        while (left := stop_at - time.monotonic()) > 0:
            time.sleep(min(60.0, left))
            with tally.lock:
                line = f"{sum(tally.by_kind.values())} requests, statuses {tally.statuses}"
            print(f"[{time.monotonic() - started:.0f} s] {line}", flush=True)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(args.clients)]
    threads.append(threading.Thread(target=report, daemon=True))
    if args.pid:
        threads.append(threading.Thread(target=sample_rss, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    idle = _wait_idle(args.url)
    picked = random.Random(args.seed).sample(tally.replays,
                                             min(len(tally.replays), args.max_replays))
    replay = replay_alone(args.url, headers, picked, args.tie)
    replayed, mismatches = replay["engine"], replay["mismatches"]
    after = _health(args.url)
    submitted = after["num_submitted"] - before["num_submitted"]
    ended = sum(after[k] - before[k] for k in ("num_finished", "num_cancelled", "num_failed"))
    checks = {
        "no 5xx": not any(s >= 500 for s in tally.statuses),
        "no token mismatch": not mismatches,  # near-tie flips aside
        "no pages held": idle["kv_pages_used"] == 0 and idle["num_running"] == 0
        and idle["num_waiting"] == 0,
        "counters match": submitted - replayed == tally.engine_requests and ended == submitted,
    }
    growth = (rss[-1] - rss[0]) / rss[0] if len(rss) > 1 else None
    if growth is not None:
        checks["rss growth <= 2%"] = growth <= 0.02
    gpu_growth = (gpu[-1] - gpu[0]) / gpu[0] if len(gpu) > 1 and gpu[0] else None
    if gpu_growth is not None:
        checks["gpu memory growth <= 2%"] = gpu_growth <= 0.02
    return {"clients": args.clients, "minutes": args.minutes, "requests": tally.by_kind,
            "statuses": tally.statuses, "engine_requests": tally.engine_requests,
            "disconnects": tally.by_kind.get("disconnect", 0),
            "generated_tokens": after["num_generated_tokens"] - before["num_generated_tokens"],
            "prompt_tokens": after["num_prompt_tokens"] - before["num_prompt_tokens"],
            "remembered": len(tally.replays), "replayed": len(picked),
            "near_tie_flips": replay["flips"], "sampled_flips": replay["sampled_flips"],
            "mismatches": mismatches[:10], "failures": tally.failures[:20],
            "unexplained": replay["unexplained"][:10],
            "health_submitted": submitted, "health_ended": ended, "rss_growth": growth,
            "rss_mib": [round(rss[0] / 2**20), round(rss[-1] / 2**20)] if rss else None,
            # a sample a minute (every 120th of the half-second ones): growth that levels off
            # (allocator arenas, caches filling) against growth that goes on (a leak)
            "rss_mib_by_minute": [round(v / 2**20) for v in rss[::120]],
            "gpu_growth": gpu_growth, "gpu_mib": [gpu[0], gpu[-1]] if gpu else None,
            "checks": checks, "ok": all(checks.values())}


def _gpu_mib(pid: int) -> float | None:
    """The GPU memory nvidia-smi counts for `pid` (MiB), None where it sees none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [float(m) for p, m in (line.split(",") for line in out.splitlines() if "," in line)
            if p.strip() == str(pid)]
    return sum(used) if used else None


def _health(url: str) -> dict:
    """/health, current: `hybrid cluster`'s (it lists "replicas") sums what each replica
    pushed within the last second, so it is read again after that second."""
    h = httpx.get(f"{url}/health", timeout=30).json()
    if "replicas" in h:
        time.sleep(CLUSTER_PUSH_S)
        h = httpx.get(f"{url}/health", timeout=30).json()
    return h


def _wait_idle(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = httpx.get(f"{url}/health", timeout=30).json()
        if h["num_running"] == 0 and h["num_waiting"] == 0:
            h = _health(url)
        if (h["num_running"] == 0 and h["num_waiting"] == 0) or time.monotonic() > deadline:
            return h
        time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pid", type=int, default=None, help="the server's process, for its RSS")
    ap.add_argument("--max-replays", type=int, default=400,
                    help="greedy and seeded requests replayed alone afterwards (a sample)")
    ap.add_argument("--tie", type=float, default=0.05,
                    help="nats: a greedy token that differs alone by at most this is a near-tie")
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace", default=None,
                    help="the server's --trace-steps file: each unexplained answer's steps "
                         "go into the JSON")
    args = ap.parse_args()
    result = run(args)
    if args.trace:
        for u in result["unexplained"]:
            if u.get("id"):
                u["trace"] = steps_of(args.trace, u["id"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{sum(result['requests'].values())} requests from {args.clients} clients in "
          f"{args.minutes} min: {result['requests']}")
    print(f"statuses {result['statuses']}; {result['engine_requests']} admitted, "
          f"{result['disconnects']} disconnected mid-stream; {result['generated_tokens']} tokens "
          f"generated, {result['prompt_tokens']} prefilled; {result['replayed']} of "
          f"{result['remembered']} replayed alone: {len(result['near_tie_flips'])} greedy "
          f"near-tie flips (gaps {result['near_tie_flips']}), {result['sampled_flips']} seeded "
          f"samples that differ from the batched run and reproduce alone")
    print(f"RSS MiB {result['rss_mib']} (growth {result['rss_growth']}); GPU MiB "
          f"{result['gpu_mib']} (growth {result['gpu_growth']})")
    for name, ok in result["checks"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    for line in result["mismatches"] + result["failures"]:
        print(f"  {line}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
