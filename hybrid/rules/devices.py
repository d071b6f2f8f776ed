"""Device names in rules: `cpu`, `cuda`, `cuda:N`; checked against the machine at planning time."""

from __future__ import annotations

import re
from collections.abc import Mapping

from hybrid.errors import HybridError

_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def parse_device(name: str) -> str:
    """The canonical form of a device name (`cuda` -> `cuda:0`); raises for anything else."""
    if not _DEVICE_RE.match(name):
        raise HybridError(f"device {name!r} is not cpu, cuda or cuda:N")
    return "cuda:0" if name == "cuda" else name


def map_device(name: str, mapping: Mapping[str, str] | None) -> str:
    """Apply a device mapping (e.g. every cuda device -> cpu, for tests and dry runs)."""
    dev = parse_device(name)
    if not mapping:
        return dev
    if dev in mapping:
        return parse_device(mapping[dev])
    kind = dev.split(":")[0]
    return parse_device(mapping[kind]) if kind in mapping else dev


def parse_device_map(text: str | None) -> dict[str, str] | None:
    """`cuda=cpu` or `cuda:1=cuda:0,cuda:2=cpu` -> the mapping map_device applies."""
    if not text:
        return None
    mapping = {}
    for part in text.split(","):
        src, sep, dst = part.partition("=")
        if not sep:
            raise HybridError(f"--device-map takes FROM=TO pairs (e.g. cuda=cpu), got {part!r}")
        src = src.strip() if src.strip() in ("cuda", "cpu") else parse_device(src.strip())
        mapping[src] = parse_device(dst.strip())
    return mapping


def check_available(device: str, source: str, cpu_rules: str = "cpu.yaml") -> None:
    """Fail with advice when a rule names a GPU this machine does not have; `cpu_rules`: the
    bundled rules that run the model on the CPU alone."""
    if device == "cpu":
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.split(":")[1])
    if index >= count:
        have = f"{count} CUDA device(s)" if count else "no CUDA GPU"
        raise HybridError(
            f"{source} places modules on {device} but this machine has {have}; "
            f"use --optimize-rules {cpu_rules} to run everything on the CPU"
        )
