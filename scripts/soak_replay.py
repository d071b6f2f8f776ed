"""The soak's second half: the greedy and seeded requests of a batched run, run again alone.

A greedy answer that differs from its batched run is diagnosed with a third run alone that
reports the top 20 log-probabilities (5 for completions) at every step: each of the two answers
(batched, alone) must either equal that run's text or part from it at a token within `tie` nats
of that step's best. Batching changes the order of the GPU's bf16 sums (another GEMM shape,
another attention split, a prompt prefilled in other chunks or from the prefix cache), which can
flip a near-tie; a token that came from another request's context has no such standing (vocab
102400: the odds of it landing in the top 20 by chance are ~2e-4). A seeded sample is drawn from
those same logits, so it is held to what seeds promise: the same answer on two runs alone.
"""

from __future__ import annotations

import codecs
import json

import httpx

TOP_CHAT, TOP_COMPLETIONS = 20, 5  # the most each API reports


def texts(response: dict) -> list:
    """A response's choices, comparable across runs: text, or (content, tool calls)."""
    out = []
    for c in response["choices"]:
        if "message" in c:
            m = c["message"]
            calls = [c["function"] for c in m.get("tool_calls") or []]  # ids are per response
            out.append((m.get("content"), json.dumps(calls, sort_keys=True)))
        else:
            out.append(c["text"])
    return out


def replay_alone(url: str, headers: dict, replays: list, tie: float) -> dict:
    """replays: (path, body, result, response id) with result texts(...) or a stream's text ->
    {engine: requests sent, mismatches: [str], flips: [gap], sampled_flips: int, unexplained:
    [{the request, the three answers, their gaps}] (whole, for a later look)}."""
    out: dict = {"engine": 0, "mismatches": [], "flips": [], "sampled_flips": 0,
                 "unexplained": []}
    with httpx.Client(base_url=url, headers=headers, timeout=600) as http:

        def alone(path: str, body: dict) -> object:
            resp = http.post(path, json={**body, "stream": False})
            out["engine"] += body.get("n", 1)
            return texts(resp.json()) if resp.status_code == 200 else resp.status_code

        for path, body, result, response_id in replays:
            got = alone(path, body)
            if isinstance(result, str):  # a stream's text: the choice's content or text
                got = _first_text(got)
            if got == result:
                continue
            if body.get("temperature", 0) > 0:
                if alone(path, body) == alone(path, body):
                    out["sampled_flips"] += 1
                else:
                    out["mismatches"].append(f"seeded, not reproducible alone: {path} "
                                             f"{json.dumps(body)[:120]}")
                continue
            batched, again = _first_text(result), _first_text(got)
            steps = _top_steps(http, path, body)
            out["engine"] += 1
            gaps = [_gap(steps, t) if steps is not None and isinstance(t, str) else None
                    for t in (batched, again)]
            if all(g is not None and g <= tie for g in gaps):
                out["flips"].append(round(max(gaps), 5))
                continue
            third = None if steps is None else _shown(
                b"".join(t for t, _ in steps if not _special(t)))[0]
            same = "the alone run" if third == again else \
                "the batched run" if third == batched else "neither"
            out["mismatches"].append(f"gaps {gaps} (the third run equals {same}): {path} "
                                     f"{json.dumps(body)[:120]} {_parting(batched, again)}")
            # the third run's tokens and candidates too: where a batched token came from
            out["unexplained"].append({"path": path, "id": response_id, "body": body,
                                       "batched": batched,
                                       "alone": again, "third": third, "gaps": gaps,
                                       "steps": _printable(steps)})
    return out


def steps_of(trace_path: str, response_id: str) -> list[dict]:
    """The lines of a `hybrid serve --trace-steps` file with a step that carried the response's
    first choice: where each of its tokens was sampled and what shared those steps."""
    rid = f"{response_id}-0"
    out = []
    with open(trace_path) as f:
        for line in f:
            if rid in line:
                step = json.loads(line)
                step["own"] = [c for c in step["chunks"] if c[0] == rid]
                step["token"] = next((t for r, t in step["sampled"] if r == rid), None)
                out.append(step)
    return out


def _printable(steps: list | None) -> list | None:
    """_top_steps' steps for JSON: (token, [(candidate, logprob)]) with bytes shown as text."""
    if steps is None:
        return None
    def show(b: bytes) -> str:
        return b.decode("utf-8", "backslashreplace")
    return [(show(t), [(show(c), round(v, 5)) for c, v in top]) for t, top in steps]


def _first_text(result: object) -> object:
    """The first choice's text (or message content; None for a tool call), else `result`."""
    if isinstance(result, list) and result:
        first = result[0]
        return first[0] if isinstance(first, tuple) else first
    return result


def _parting(a: object, b: object) -> str:
    if not (isinstance(a, str) and isinstance(b, str)):
        return f"{a!r} != {b!r}"[:300]
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"parted after {k} chars: {a[k:k + 40]!r} != {b[k:k + 40]!r}"


def _top_steps(http: httpx.Client, path: str, body: dict) -> list | None:
    """One more run alone with log-probabilities -> [(token bytes, [(candidate bytes,
    logprob)])] a step, or None when it failed."""
    chat = path.endswith("chat/completions")
    extra = {"logprobs": True, "top_logprobs": TOP_CHAT} if chat else {"logprobs": TOP_COMPLETIONS}
    resp = http.post(path, json={**body, **extra, "stream": False})
    if resp.status_code != 200:
        return None
    lp = resp.json()["choices"][0]["logprobs"]
    if chat:
        return [(bytes(t["bytes"] or []), [(bytes(c["bytes"] or []), c["logprob"])
                                           for c in t["top_logprobs"]]) for t in lp["content"]]
    return [(t.encode(), [(c.encode(), v) for c, v in top.items()])
            for t, top in zip(lp["tokens"], lp["top_logprobs"], strict=True)]


def _special(token: bytes) -> bool:
    """A special token (DeepSeek's `<｜...｜>` and `<|...|>` forms): the server leaves it out
    of the text it returns, but the log-probabilities list it."""
    return ((token.startswith("<｜".encode()) and token.endswith("｜>".encode()))
            or (token.startswith(b"<|") and token.endswith(b"|>")))


def _shown(data: bytes) -> tuple[str, bytes]:
    """What the server's detokenizer shows for token bytes `data` (invalid bytes as U+FFFD),
    and the bytes of an incomplete last character it holds back."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return decoder.decode(data), decoder.getstate()[0]


def _fits(data: bytes, text: str) -> bool:
    """Whether token bytes `data` could have written the start of `text`."""
    shown, held = _shown(data)
    if not text.startswith(shown):
        return False
    following = text[len(shown):len(shown) + 1]
    return not held or following == "\ufffd" or following.encode().startswith(held)


def _gap(steps: list, text: str) -> float | None:
    """How far `text` strays from the run `steps` describes: 0 where it follows it, else the
    step's best logprob minus that of the token `text` took where they part (None: that token
    is not among the step's reported candidates). Texts are compared as the server shows
    them: a token's bytes may end mid-character or be invalid UTF-8 (a random model writes
    such), shown as U+FFFD, and special tokens are not in them."""
    done = b""
    for token, top in steps:
        if len(_shown(done)[0]) >= len(text):
            return 0.0  # text ended first (a stop string)
        if _special(token):
            continue  # not in the text: the next step's token follows it there
        if token and _fits(done + token, text):
            done += token
            continue
        theirs = [v for c, v in top if c and _fits(done + c, text)]
        return max(v for _, v in top) - max(theirs) if theirs else None
    return 0.0
