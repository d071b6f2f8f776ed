"""What keeps a conversation on one replica, where its prefix is cached: a key a request
shares with the later requests of its conversation, and the replica a key goes to (rendezvous
hashing: stable while the replicas stay; a replica that leaves moves only its own keys).
No ray import: router.py applies it in Ray Serve's request router."""

from __future__ import annotations

import hashlib
import json

# the routes whose requests carry a conversation (messages) or a prompt
_CHAT_PATHS = ("/v1/chat/completions", "/api/chat")
_PROMPT_PATHS = ("/v1/completions", "/api/generate")
PROMPT_AFFINITY_CHARS = 512  # a prompt's head that picks its replica


def affinity_key(path: str, body: bytes) -> str | None:
    """The part of a request that later requests of the same conversation repeat: a chat's
    messages up to its first user message; a completion's first PROMPT_AFFINITY_CHARS of
    prompt. None for other routes and for bodies that are no JSON object."""
    if path not in _CHAT_PATHS + _PROMPT_PATHS or not body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    if path in _CHAT_PATHS:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        head = []
        for m in messages:
            head.append(m)
            if isinstance(m, dict) and m.get("role") == "user":
                break
        text = json.dumps(head, sort_keys=True, default=str)
    else:
        prompt = data.get("prompt")
        if isinstance(prompt, list):
            prompt = json.dumps(prompt[:PROMPT_AFFINITY_CHARS // 4])
        if not isinstance(prompt, str) or not prompt:
            return None
        text = prompt[:PROMPT_AFFINITY_CHARS]
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def rendezvous_order(key: str, replica_ids: list[str]) -> list[str]:
    """replica_ids, the key's replica first (highest hash of key and id), then the rest in the
    order the same rule gives."""
    def score(rid: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{key}|{rid}".encode(), digest_size=8).digest(),
                              "big")
    return sorted(replica_ids, key=score, reverse=True)


