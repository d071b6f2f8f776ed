"""Settings declared once. A config field made with `setting` carries what its command-line
flag says (help, choices, an other flag name, a metavar); `hybrid serve`'s parser is built from
the fields (cli/flags.py) and `check_choices` validates every field that has choices, so
a setting is written in one place. Fields made without it are not flags."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, Field
from typing import Any

from hybrid.errors import HybridError


def setting(default: Any = MISSING, *, help: str, choices: tuple[str, ...] | None = None,
            flag: str | None = None, metavar: str | None = None) -> Field:
    """A dataclass field that is also a flag: `help` its text, `choices` its legal values,
    `flag` its name where not --the-field-name (or --no-the-field-name for a bool that is on
    by default)."""
    metadata = {"help": help, "choices": choices, "flag": flag, "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


def flag_fields(config_type: type) -> list[Field]:
    """The fields of a config class that are flags, in declaration order."""
    return [f for f in dataclasses.fields(config_type) if "help" in f.metadata]


def check_choices(config: object) -> None:
    """HybridError naming the field, its legal values and the value, for the first field of
    `config` whose value is not among its declared choices."""
    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        value = getattr(config, f.name)
        if choices is not None and value not in choices:
            raise HybridError(f"{f.name} must be one of {', '.join(choices)}, got {value!r}")
