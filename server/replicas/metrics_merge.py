"""/metrics of several replicas as one Prometheus text: every sample labelled with its
replica, each metric family written once (its HELP and TYPE, then every replica's samples),
as the exposition format wants a family's samples together."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(.*)$")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _family(name: str, families: dict) -> str:
    """The family a sample belongs to: its name, or the name less a histogram's suffix."""
    if name in families:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[:-len(suffix)] in families:
            return name[:-len(suffix)]
    return name


def merge(texts: dict[str, str]) -> str:
    """texts: replica name -> its /metrics text -> one text, label replica="name" added."""
    families: dict[str, dict] = {}  # name -> {"meta": [...], "samples": [...]}, in first order

    def family(name: str) -> dict:
        return families.setdefault(name, {"meta": [], "samples": []})
    for replica, text in texts.items():
        label = 'replica="' + replica.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                name = line.split()[2]
                f = family(name)
                if not any(m.split()[1] == line.split()[1] for m in f["meta"]):
                    f["meta"].append(line)
                continue
            m = _SAMPLE.match(line)
            if not m:
                continue
            name, labels, value = m.groups()
            labels = "{" + label + ("," + labels[1:-1] if labels and labels != "{}" else "") + "}"
            family(_family(name, families))["samples"].append(f"{name}{labels} {value}")
    out = []
    for f in families.values():
        out += f["meta"] + f["samples"]
    return "\n".join(out) + "\n"
