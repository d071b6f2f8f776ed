"""Command-line flags made from config fields declared with `hybrid.settings.setting`: the name
(--field-name, --no-field-name for a bool on by default, or the field's own), the type (from
its annotation), the default, the choices and the help all come from the field."""

from __future__ import annotations

import argparse
from dataclasses import Field

from hybrid.settings import flag_fields


def flag_of(f: Field) -> str:
    if f.metadata.get("flag"):
        return f.metadata["flag"]
    name = f.name.replace("_", "-")
    return f"--no-{name}" if f.default is True else f"--{name}"


def add_flags(parser: argparse.ArgumentParser, *config_types: type) -> list[str]:
    """One flag per declared field of each config class (in declaration order) -> the field
    names, each the flag's `dest`."""
    names = []
    for config_type in config_types:
        for f in flag_fields(config_type):
            kwargs: dict = {"dest": f.name, "default": f.default, "help": f.metadata["help"]}
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
            if f.metadata.get("choices") is not None:
                kwargs["choices"] = list(f.metadata["choices"])
            annotation = str(f.type)
            if annotation == "bool":
                kwargs["action"] = "store_false" if f.default is True else "store_true"
            elif "float" in annotation:
                kwargs["type"] = float
            elif "int" in annotation:
                kwargs["type"] = int
            parser.add_argument(flag_of(f), **kwargs)
            names.append(f.name)
    return names
