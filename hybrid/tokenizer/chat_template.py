"""Render a GGUF's `tokenizer.chat_template` (Jinja2, sandboxed) the way HF and llama.cpp do."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hybrid.errors import HybridError

# DeepSeek-V3's conversation format, for files that carry no template of their own (and for the
# synthetic models): BOS, system text, then <｜User｜>/<｜Assistant｜> turns; an assistant turn
# ends with EOS. Reasoning (<think>...</think>) of earlier assistant turns is dropped, as R1 does;
# tool calls and outputs are written in DeepSeek-V3's markers (hybrid/tokenizer/templates has
# the families' real templates).
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
    "<｜Assistant｜>{{ c }}"
    "{% if m['tool_calls'] %}<｜tool▁calls▁begin｜>{% for t in m['tool_calls'] %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    "{{ t['function']['name'] }}\n```json\n{{ t['function']['arguments'] }}\n```"
    "<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>{% endif %}"
    "<｜end▁of▁sentence｜>"
    "{% elif m['role'] == 'tool' %}"
    "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{{ m['content'] }}<｜tool▁output▁end｜>"
    "<｜tool▁outputs▁end｜>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' tojson: plain json.dumps, unlike Jinja's own, which escapes <, >, & and '
    # for HTML and so would change the tool declarations Kimi-K2's template writes
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or DEEPSEEK_V3_TEMPLATE
        # the environment transformers renders chat templates in: {% break %} (Kimi-K2's) needs
        # loopcontrols; the same globals and tojson
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
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
        """`kwargs` reach the template as variables (`tools`, `thinking`, ...)."""
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
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
            # a template indexing what the messages lack, or adding None to text (DeepSeek's
            # concatenate content with +): the messages do not fit this template
            raise HybridError(f"the chat template cannot render these messages: "
                              f"{type(e).__name__}: {e}") from None
