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


class DeviceLost(HybridError):
    """The GPU stopped answering mid-step: no later step can run, so the server stops."""


# How a CUDA error reads once torch raises it (RuntimeError or torch.AcceleratorError): the
# context is then unusable, every later launch fails the same way. Out-of-memory is not one.
_CUDA_ERROR_MARKERS = ("CUDA error", "cudaError", "CUBLAS_STATUS", "CUDA driver error")


def is_device_lost(error: BaseException) -> bool:
    """The step failed because the GPU did: an unrecoverable CUDA error or a lost device."""
    return isinstance(error, DeviceLost) or any(m in str(error) for m in _CUDA_ERROR_MARKERS)


def shown(value: object, limit: int = 64) -> str:
    """`value` as one short printable line for an error message: bytes that are not UTF-8 and
    characters that are not printable escaped (`\\xff`, `\\n`), cut to `limit` characters with
    the full length said, so a corrupt file's bytes never pour into the terminal."""
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", errors="backslashreplace")
    else:
        text = str(value)
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(out) > limit:
        return f"{out[:limit]}... ({len(text)} characters)"
    return out
