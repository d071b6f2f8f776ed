"""The real chat templates of the deepseek2-architecture families, as their files carry them.

A GGUF made by llama.cpp's converter copies `chat_template` from the model's
tokenizer_config.json into `tokenizer.chat_template`; these are those texts, unchanged, for
files converted without one (or with an older revision), for `make-model --chat-template`, and
for the tests that render and parse each family's tool calls:

  deepseek-v3        DeepSeek-V3 (Dec 2024): tool calls rendered only for content None
  deepseek-r1        DeepSeek-R1 (the revision that opens the reply with "<think>\\n")
  deepseek-v3.1      DeepSeek-V3.1: thinking and non-thinking modes, calls without a fence
  kimi-k2            Kimi-K2-Instruct (first release): tools declared, calls not rendered
  kimi-k2-thinking   Kimi-K2-Thinking: tools declared, calls and their returns rendered
  deepseek-v3.2      DeepSeek-V3.2: tools declared, DSML calls, thinking and chat modes
  deepseek-v4        DeepSeek-V4: as V3.2's, tool results inside user turns

Sources: the model repositories' tokenizer_config.json as copied into public projects
(llama.cpp's models/templates for deepseek-v3.1, kimi-k2, kimi-k2-thinking; two independent
copies agreeing for deepseek-r1; a provider's model list for deepseek-v3). DeepSeek-V3.2 and V4
ship no template but a Python encoder (encoding/encoding_dsv32.py, encoding_dsv4.py):
deepseek-v3.2 and deepseek-v4 are ours, written to render what those encoders do
(tests/test_tool_calls_dsml.py), and the templates of `deepseek32` and `deepseek4` files that
carry none.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from hybrid.errors import HybridError

BUNDLED_TEMPLATES = ("deepseek-v3", "deepseek-r1", "deepseek-v3.1", "kimi-k2",
                     "kimi-k2-thinking", "deepseek-v3.2", "deepseek-v4")


def bundled_template(name: str) -> str:
    if name not in BUNDLED_TEMPLATES:
        raise HybridError(f"no bundled chat template {name!r}; choose one of "
                          f"{', '.join(BUNDLED_TEMPLATES)}, or give a .jinja file")
    ref = resources.files("hybrid.tokenizer").joinpath("templates", f"{name}.jinja")
    return ref.read_text(encoding="utf-8")


def load_template(name_or_path: str) -> str:
    """A bundled template's text by name, or a Jinja file's."""
    if name_or_path in BUNDLED_TEMPLATES:
        return bundled_template(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise HybridError(f"chat template {name_or_path!r} is neither a bundled name ("
                          f"{', '.join(BUNDLED_TEMPLATES)}) nor a file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HybridError(f"cannot read the chat template {path}: {e}") from None
