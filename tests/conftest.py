"""Shared fixtures: synthetic GGUF models, written once per test session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hybrid.synth.make_model import MakeModelOptions, make_model
from hybrid.synth.make_v4 import make_v4
from hybrid.synth.presets import get_preset
from hybrid.synth.presets_v4 import V4_PRESETS
from hybrid.synth.vocab import get_vocab

# fast mode's packed-expert cache of the session's throwaway models: not the user's cache, and
# gone with the session (servers the tests start inherit it)
if "HYBRID_PACKED_CACHE_DIR" not in os.environ:
    os.environ["HYBRID_PACKED_CACHE_DIR"] = tempfile.mkdtemp(prefix="hybrid-packed-")
    atexit.register(shutil.rmtree, os.environ["HYBRID_PACKED_CACHE_DIR"], ignore_errors=True)


class ModelFactory:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[tuple, list[Path]] = {}

    def files(self, preset: str = "tiny-v3", quant: str = "f32", layout: str = "legacy",
              split: int = 1, vocab: str = "small", seed: int = 0,
              chat_template: str | None = None) -> list[Path]:
        key = (preset, quant, layout, split, vocab, seed, chat_template)
        if key not in self._built and preset in V4_PRESETS:  # deepseek4: one layout, no splits
            v4 = V4_PRESETS[preset]
            out = self.root / "-".join(map(str, key)) / f"{preset}-{quant}.gguf"
            self._built[key] = make_v4(v4, quant, seed, get_vocab(vocab, v4.vocab_size), out,
                                       chat_template=chat_template)
        if key not in self._built:
            p = get_preset(preset)
            folder = self.root / "-".join(map(str, key)).replace("/", "_")
            out = folder / f"{preset}-{quant}-{layout}.gguf"
            opts = MakeModelOptions(p, quant, layout, seed, split, vocab,
                                    chat_template=chat_template)
            self._built[key] = make_model(opts, get_vocab(vocab, p.vocab_size), out)
        return self._built[key]

    def path(self, *args, **kwargs) -> Path:
        return self.files(*args, **kwargs)[0]


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    return ModelFactory(tmp_path_factory.mktemp("models"))
