"""User-facing errors.

Every problem a user can cause (a bad file, a bad flag, a bad request) is raised as a
`HybridError` whose message is one line that names the problem and what to do. The CLI prints
that line and exits non-zero; it never prints a traceback for a `HybridError`.
"""

from __future__ import annotations


class HybridError(Exception):
    """An error caused by user input, with a one-line message meant for the user."""


class GGUFError(HybridError):
    """A GGUF file that cannot be used: bad header, missing parts, unsupported types, bad shapes."""


class RequestRejected(HybridError):
    """A request the engine can never run (e.g. longer than the KV cache); the server's 400."""
