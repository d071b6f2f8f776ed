"""Settings declared once: `hybrid serve`'s flags are made from the fields of EngineConfig and
ServerConfig (name, type, default, choices, help), the README lists exactly those flags, and
choices are checked from the same declaration."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from cli.flags import flag_of
from cli.main import build_parser
from hybrid.engine.config import EngineConfig
from hybrid.errors import HybridError
from hybrid.settings import flag_fields
from server.config import ServerConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def _serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {
        "--help"}


def test_every_declared_field_is_a_flag_and_nothing_else_is() -> None:
    declared = [f for cls in (EngineConfig, ServerConfig) for f in flag_fields(cls)]
    assert _flags(_serve_parser()) == {flag_of(f) for f in declared}
    assert {f.name for f in declared} >= {"gguf_path", "cache_lens", "port", "routing_profile"}
    assert "record_routing" not in {f.name for f in declared}  # set by --record-routing FILE


def test_the_readme_lists_every_serve_flag() -> None:
    text = README.read_text()
    block = re.search(r"`hybrid serve (\[.*?)`", text, re.DOTALL)
    assert block, "README: no `hybrid serve [...]` synopsis"
    listed = set(re.findall(r"\[(--[a-z0-9-]+)", block.group(1)))
    assert listed == _flags(_serve_parser())


def test_flags_parse_to_the_fields_types_and_build_the_config() -> None:

    args = build_parser().parse_args(
        ["serve", "--cache-lens", "4096", "--stream-memory-gib", "1.5", "--no-cuda-graph",
         "--force-think", "--decode-graph", "layers", "--record-routing", "p.json",
         "--port", "0"])
    values = {name: getattr(args, name) for name in args.settings}
    config = ServerConfig.from_flat(values)
    e = config.engine
    assert (e.cache_lens, e.stream_memory_gib, e.cuda_graphs, e.decode_graph) == \
        (4096, 1.5, False, "layers")
    assert config.force_think and config.routing_profile == "p.json" and e.record_routing
    assert config.port == 0
    defaults = build_parser().parse_args(["serve"])
    built = ServerConfig.from_flat({n: getattr(defaults, n) for n in defaults.settings})
    assert built == ServerConfig()  # the parser's defaults are the fields' defaults


def test_choices_come_from_the_declaration() -> None:
    for cls, name, bad in ((EngineConfig, "attention_backend", "xformers"),
                           (EngineConfig, "prefill_experts", "gpu"),
                           (ServerConfig, "log_level", "verbose")):
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        with pytest.raises(HybridError, match=f"{name} must be one of "
                           f"{', '.join(field.metadata['choices'])}, got '{bad}'"):
            cls(**{name: bad})
