"""What several replicas report, as one: their /metrics as one Prometheus text (every sample
labelled with its replica, each metric family written once: its HELP and TYPE, then every
replica's samples, as the exposition format wants a family's samples together), and their
/health as one answer (the counters summed, each replica's own beside)."""

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


# /health fields that are the most seen or a setting rather than a count: the largest is kept
_NOT_SUMMED = ("max_running", "max_batch_requests", "kv_page_size")


def merge_health(healths: dict[str, dict]) -> dict:
    """healths: replica name -> its /health answer (non-empty) -> the cluster's: every
    numeric counter summed over the replicas (the most seen for _NOT_SUMMED), the model
    and status of the first, and each replica's answer under "replicas"."""
    first = next(iter(healths.values()))
    out: dict = {"status": first.get("status", "ok"), "model": first.get("model")}
    for key, value in first.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [h.get(key, 0) for h in healths.values()]
            out[key] = max(values) if key in _NOT_SUMMED else sum(values)
    out["replicas"] = dict(healths)
    return out
