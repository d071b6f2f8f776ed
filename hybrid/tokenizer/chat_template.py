"""Render a GGUF's `tokenizer.chat_template` (Jinja2, sandboxed) the way HF and llama.cpp do."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hybrid.errors import HybridError

# DeepSeek-V3's conversation format, for files that carry no template of their own (and for the
# synthetic models): BOS, system text, then <｜User｜>/<｜Assistant｜> turns; an assistant turn
# ends with EOS. Reasoning (<think>...</think>) of earlier assistant turns is dropped, as R1 does.
DEEPSEEK_V3_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.system = ns.system + (m['content'] if ns.system == '' else '\n\n' + m['content']) %}"
    "{% endif %}{% endfor %}"
    "{{ bos_token }}{{ ns.system }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}{% set c = m['content'] or '' %}"
    "{% if '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "<｜Assistant｜>{{ c }}<｜end▁of▁sentence｜>"
    "{% elif m['role'] == 'tool' %}"
    "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m['content'] }}<｜tool▁output▁end｜>"
    "<｜tool▁outputs▁end｜>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or DEEPSEEK_V3_TEMPLATE
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except TemplateError as e:
            raise HybridError(f"the model's chat template does not compile: {e}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **kwargs,
            )
        except TemplateError as e:
            raise HybridError(f"the chat template rejected the messages: {e}") from None
