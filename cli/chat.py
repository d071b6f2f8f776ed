"""`hybrid chat`: the interactive loop, in-process or against a running server (`--url`).

The remote client speaks /v1/chat/completions with streaming through the standard library's
urllib, so the CLI needs no HTTP package. A thinking model's reasoning (`reasoning_content`)
goes to stderr and the answer to stdout; only the answer is kept in the conversation.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from hybrid.errors import HybridError

# One reply, as (reasoning, answer) text pieces, for the conversation so far.
Respond = Callable[[list[dict[str, str]]], Iterator[tuple[str, str]]]


def chat_loop(respond: Respond, system: str | None) -> int:
    """Read lines until EOF or /exit; /reset clears the conversation (keeping the system)."""
    head = [{"role": "system", "content": system}] if system else []
    messages = list(head)
    print("hybrid chat: type a message; /reset clears the conversation, /exit or Ctrl-D quits.",
          file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            messages = list(head)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = ""
        for reasoning, content in respond(messages):
            if reasoning:
                sys.stderr.write(reasoning)
                sys.stderr.flush()
            reply += content
            sys.stdout.write(content)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})


class RemoteChat:
    """A running server's /v1/chat/completions, streamed. `sampling`: OpenAI request fields."""

    def __init__(self, url: str, api_key: str | None, model: str | None,
                 sampling: dict[str, Any], timeout_s: float = 600) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout_s = timeout_s
        self.sampling = sampling
        # Ask now, so a wrong URL or key is an error before the first prompt.
        if model is None:
            with self._open("GET", "/v1/models") as response:
                model = json.loads(response.read())["data"][0]["id"]
        self.model = model

    def __call__(self, messages: list[dict[str, str]]) -> Iterator[tuple[str, str]]:
        body = {"model": self.model, "messages": messages, "stream": True, **self.sampling}
        with self._open("POST", "/v1/chat/completions", body) as response:
            for raw in response:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise HybridError(f"the server failed: {chunk['error']['message']}")
                for choice in chunk["choices"]:
                    delta = choice["delta"]
                    yield delta.get("reasoning_content") or "", delta.get("content") or ""

    def _open(self, method: str, path: str, body: dict | None = None) -> Any:
        """The open response (an http.client.HTTPResponse); HTTP errors as HybridError."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data, self.headers, method=method)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            raise HybridError(f"{self.url}{path} answered {e.code}: {_error_message(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise HybridError(f"cannot reach {self.url}: {reason}") from None


def _error_message(e: urllib.error.HTTPError) -> str:
    text = e.read().decode("utf-8", errors="replace")
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text[:200]


def openai_sampling(params: Any) -> dict[str, Any]:
    """A SamplingParams as OpenAI (and vLLM extra) request fields."""
    body = {"max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k, "min_p": params.min_p,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "repetition_penalty": params.repetition_penalty}
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    return body
