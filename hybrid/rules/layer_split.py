"""A one-GPU rule file spread over several GPUs by layer ranges.

Layers [0, b1) stay on the file's GPU, [b1, b2) go to the second GPU, and so on; the final norm
and the output head go with the last range, the embeddings stay with the first. The residual
stream crosses GPUs once at each boundary (the decoder's crossings, step/decoder.py), so a
boundary right after a MoE layer whose experts run on the CPU costs one copy a step that the
CPU's experts hide.

Each rule that places modules on the file's GPU is copied once per further range, in front of
it (the first matching rule wins), with its name regex narrowed to that range's modules by a
lookahead and its devices (`generate_device`, `prefill_device`, a hot experts' `gpu_device`)
moved to the range's GPU. The original keeps the first range's modules and whatever else it
matched. Rules on the CPU stay as they are.
"""

from __future__ import annotations

import re
from pathlib import Path

from hybrid.errors import HybridError

DEVICE_KEYS = ("generate_device", "prefill_device", "gpu_device")
FIRST_GPU = ("cuda", "cuda:0")


def even_boundaries(num_layers: int, first_moe_layer: int, parts: int) -> list[int]:
    """`parts - 1` boundaries that split the MoE layers [first_moe_layer, num_layers) into
    ranges of (nearly) equal length; the dense layers before them go with the first range."""
    moe = num_layers - first_moe_layer
    if parts < 2 or moe < parts:
        raise HybridError(f"{moe} MoE layers cannot be split over {parts} GPUs")
    return [first_moe_layer + k * moe // parts for k in range(1, parts)]


def range_pattern(start: int, stop: int, last: bool) -> str:
    """A lookahead (at the path's start) for the modules of layers [start, stop), and with
    `last` the final norm and head."""
    layers = "|".join(str(i) for i in range(start, stop))
    alternatives = [rf"model\.layers\.(?:{layers})(?:\.|$)"]
    if last:
        alternatives += [r"model\.norm$", r"lm_head$"]
    return f"^(?=(?:{'|'.join(alternatives)}))"


def split_rules(data: list[dict], boundaries: list[int], devices: list[str],
                num_layers: int) -> list[dict]:
    """The rules of a one-GPU file (parsed YAML), spread over `devices` (one more than
    `boundaries`, the first being the file's own GPU) -> the spread rules."""
    if len(devices) != len(boundaries) + 1:
        raise HybridError(f"{len(boundaries)} boundaries need {len(boundaries) + 1} devices, "
                          f"got {len(devices)}")
    if list(boundaries) != sorted(set(boundaries)) or not 0 < boundaries[0] \
            or boundaries[-1] >= num_layers:
        raise HybridError(f"layer boundaries {boundaries} must rise within 1..{num_layers - 1}")
    stops = [*boundaries, num_layers]
    out = []
    for rule in data:
        kwargs = rule.get("replace", {}).get("kwargs", {}) or {}
        if not any(kwargs.get(k) in FIRST_GPU for k in DEVICE_KEYS):
            out.append(rule)
            continue
        name = rule.get("match", {}).get("name")
        for k in range(len(boundaries), 0, -1):  # the later ranges first: none overlaps
            last = k == len(boundaries)
            if not _may_match(name, last):
                continue
            look = range_pattern(stops[k - 1], stops[k], last)
            copy = {**rule, "match": {**rule["match"],
                                      "name": look if not name else f"{look}(?:.*?)(?:{name})"},
                    "replace": {**rule["replace"], "kwargs": {
                        key: devices[k] if key in DEVICE_KEYS and value in FIRST_GPU else value
                        for key, value in kwargs.items()}}}
            out.append(copy)
        out.append(rule)
    return out


def _may_match(name: str | None, last: bool) -> bool:
    """Whether a rule's name regex may match a module of a later range: any not anchored to
    a path outside the layers (the embeddings, the rotary table), and for the last range the
    final norm and head."""
    if not name or not name.startswith("^") or name.startswith(r"^model\.layers"):
        return True
    return last and any(re.search(name, path) for path in ("model.norm", "lm_head"))


def write_split(rules: str, boundaries: list[int], devices: list[str], num_layers: int,
                folder: Path) -> Path:
    """A copy of rule file `rules` (bundled name or path) spread by `split_rules`, written
    into `folder`."""
    import yaml

    from hybrid.rules.planner import find_rules

    source = find_rules(rules)
    data = yaml.safe_load(source.read_text())
    spread = split_rules(data, boundaries, devices, num_layers)
    path = Path(folder) / f"{source.stem}-split-{'-'.join(map(str, boundaries))}.yaml"
    header = (f"# {source.name} over {', '.join(devices)}: layers split at "
              f"{', '.join(map(str, boundaries))} (hybrid.rules.layer_split)\n")
    path.write_text(header + yaml.safe_dump(spread, sort_keys=False))
    return path
