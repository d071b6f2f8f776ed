"""The built-in demo model: a small synthetic DeepSeek-V3 built once into the user's cache.

It lets a fresh machine run every command with no download. Its weights are random, so its
answers are fluent-looking nonsense, but it goes through the real loading, tokenizer, chat
template and generation paths.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from hybrid.env import Env

# Bump when the synthetic writer changes what the demo file holds.
DEMO_VERSION = 1
DEMO_PRESET, DEMO_QUANT, DEMO_VOCAB = "tiny-v3", "q4_k_m", "deepseek"


def demo_model_path(env: Env | None = None, verbose: bool = True) -> Path:
    """The demo GGUF's path, building it first if this machine has none yet."""
    env = env or Env.read()
    target = env.cache_dir / "demo" / f"{DEMO_PRESET}-{DEMO_QUANT}-v{DEMO_VERSION}.gguf"
    if target.is_file():
        return target
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.vocab import get_vocab

    if verbose:
        print(f"building the demo model once into {target} ...", file=sys.stderr)
    preset = get_preset(DEMO_PRESET)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a temporary folder and rename, so a crash or a concurrent build never leaves a
    # half-written file at the target.
    tmp = Path(tempfile.mkdtemp(dir=target.parent))
    try:
        opts = MakeModelOptions(preset, quant=DEMO_QUANT, vocab=DEMO_VOCAB, seed=0)
        (built,) = make_model(opts, get_vocab(DEMO_VOCAB, preset.vocab_size), tmp / target.name)
        os.replace(built, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
