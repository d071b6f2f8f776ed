"""Requests beside a long prompt passing the layers, each greedy answer against the same
request run alone afterwards: the soak's cross-talk check narrowed to the GPU's layered
prefill (a long prompt arriving while streams decode, short prompts admitted meanwhile, some
sharing a prefix whose page the prefix cache holds).

    python scripts/crosstalk.py --url http://127.0.0.1:8000 [--rounds 6] [--long 8192]

Every request is greedy with the top 5 log-probabilities of each token. An answer that parts
from its alone run is a near tie when the batched token is among the alone run's candidates
within `--tie` nats of its best (batching reorders sums), else it is counted as wrong. Prints
one line a round and a summary; `--json` keeps every wrong answer whole. Exit status 1 if any
answer was wrong.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

import httpx

TOP = 5


def _complete(http: httpx.Client, body: dict) -> tuple[list[str], list[dict]]:
    """-> (the answer's tokens, each step's top candidates {token: logprob})."""
    r = http.post("/v1/completions", json=body)
    r.raise_for_status()
    lp = r.json()["choices"][0]["logprobs"]
    return lp["tokens"], lp["top_logprobs"]


def _parting(batched: list[str], alone: tuple[list[str], list[dict]], tie: float) -> dict | None:
    """None where the answers agree; else where they part and whether it is a near tie."""
    tokens, tops = alone
    for i, (a, b) in enumerate(zip(batched, tokens)):
        if a != b:
            top = tops[i]
            gap = max(top.values()) - top[a] if a in top else None
            return {"at": i, "batched": a, "alone": b, "gap": gap,
                    "tie": gap is not None and gap <= tie}
    if len(batched) != len(tokens):
        return {"at": min(len(batched), len(tokens)), "gap": None, "tie": False}
    return None


def one_round(http: httpx.Client, model: str, rng: random.Random, args) -> list[dict]:
    """Decoders, then the long prompt, then short prompts every few tens of ms -> every
    request's body, its batched tokens and when it was sent (s after the long prompt)."""
    vocab = args.vocab

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, vocab) for _ in range(n)]

    def body(prompt: list[int], n: int) -> dict:
        return {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
                "ignore_eos": True, "logprobs": TOP}

    shared = ids(args.shared_prefix)
    jobs = [("decode", body(ids(32), args.decode_tokens))]
    jobs += [("decode", body(ids(32), args.decode_tokens)) for _ in range(args.decoders - 1)]
    jobs.append(("long", body(ids(args.long), 4)))
    for i in range(args.shorts):
        prompt = shared + ids(rng.randint(2, 10)) if i % 2 else ids(rng.randint(5, 60))
        jobs.append(("short", body(prompt, 8)))
    results: list[dict] = []
    lock = threading.Lock()
    t_long = [0.0]

    def run(kind: str, b: dict) -> None:
        sent = time.perf_counter()
        tokens, _ = _complete(http, b)
        with lock:
            results.append({"kind": kind, "body": b, "tokens": tokens,
                            "sent_s": round(sent - t_long[0], 3),
                            "took_s": round(time.perf_counter() - sent, 3)})

    threads = []
    for kind, b in jobs:
        if kind == "long":
            time.sleep(args.lead)  # the decoders are decoding
            t_long[0] = time.perf_counter()
        elif kind == "short":
            time.sleep(args.gap)
        threads.append(threading.Thread(target=run, args=(kind, b)))
        threads[-1].start()
    for t in threads:
        t.join()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--long", type=int, default=8192, help="the long prompt's tokens")
    ap.add_argument("--decoders", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=96)
    ap.add_argument("--shorts", type=int, default=12, help="short prompts a round")
    ap.add_argument("--shared-prefix", type=int, default=70,
                    help="tokens half the short prompts share (over a page: cached)")
    ap.add_argument("--lead", type=float, default=0.3, help="s the decoders run first")
    ap.add_argument("--gap", type=float, default=0.04, help="s between short prompts")
    ap.add_argument("--vocab", type=int, default=100000)
    ap.add_argument("--tie", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    wrong, ties, total = [], 0, 0
    with httpx.Client(base_url=args.url, timeout=600) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        for r in range(args.rounds):
            batched = one_round(http, model, rng, args)
            n_wrong = n_tie = 0
            for res in batched:  # alone, one at a time
                part = _parting(res["tokens"], _complete(http, res["body"]), args.tie)
                total += 1
                if part is None:
                    continue
                if part["tie"]:
                    n_tie += 1
                    continue
                n_wrong += 1
                wrong.append({"round": r, **res, "parting": part,
                              "prompt_tokens": len(res["body"]["prompt"])})
            ties += n_tie
            print(f"round {r}: {len(batched)} requests, {n_wrong} wrong, {n_tie} near ties",
                  flush=True)
    for w in wrong:
        print(f"  wrong: round {w['round']} {w['kind']} ({w['prompt_tokens']} prompt tokens, "
              f"sent {w['sent_s']} s after the long prompt, took {w['took_s']} s): "
              f"{w['parting']}")
    print(f"{total} requests: {len(wrong)} wrong, {ties} near ties")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"requests": total, "near_ties": ties, "wrong": wrong}, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
