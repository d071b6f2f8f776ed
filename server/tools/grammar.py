"""The grammar that makes a reply a well-formed tool call (tool_choice "required" or a named
function), in the family's own format, for llguidance's Lark syntax (DeepSeek-V3.2's and V4's
DSML calls write each argument as a parameter: `_dsml_calls`).

Markers that the vocabulary holds as one special token are matched as that token (`<[id]>`),
so the model writes the calls as it was trained to; a marker it spells in text is matched as
text. Each call's arguments are a JSON value of that function's parameter schema (`%json`),
compact as the structured-output grammars are. A reply that opens inside a think block (R1)
may reason first, at most `reasoning_tokens` tokens, then closes the block and calls.
"""

from __future__ import annotations

import json
from typing import Any

from hybrid.engine.sampling.grammar import JSON_OPTIONS, closed_objects
from hybrid.errors import RequestRejected
from server.tools.formats import ToolFormat

MAX_PARALLEL_CALLS = 8  # calls in one reply under a required choice: no runaway list


def tool_call_grammar(fmt: ToolFormat, functions: dict[str, dict[str, Any]],
                      token_of: Any, parallel: bool, think_end: str | None,
                      reasoning_tokens: int, lenient: bool = False) -> str:
    """Lark text for one or more calls of `functions` (name -> parameters schema), objects
    closed to keys they do not list unless `lenient` (hybrid/engine/sampling/grammar.closed_objects).
    `token_of(text)` is the id of the special token spelling `text`, or None."""

    def lit(text: str) -> str:
        i = token_of(text)
        return f"<[{i}]>" if i is not None else json.dumps(text)

    if fmt.dsml:
        calls = _dsml_calls(fmt, functions, lit, parallel, lenient)
        return _compiled(_head(lit, think_end, reasoning_tokens) + calls)
    rules = []
    for k, (name, schema) in enumerate(functions.items()):
        schema = schema or {"type": "object"}
        schema = {**(schema if lenient else closed_objects(schema)), "x-guidance": JSON_OPTIONS}
        rules.append(f"fn_{k}: {fmt.header_grammar(name, lit)} {lit(fmt.header_end)} "
                     f"{_fence_open(fmt)}%json {json.dumps(schema)} {_fence_close(fmt)}"
                     f"{lit(fmt.call_end)}")
    alts = " | ".join(f"fn_{k}" for k in range(len(functions)))
    sep = f"{json.dumps(fmt.call_separator)} " if fmt.call_separator else ""
    more = f" ({sep}call){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel else ""
    lines = [f"calls: {lit(fmt.section_begin)} call{more} {lit(fmt.section_end)}",
             f"call: {lit(fmt.call_begin)} ({alts})", *rules]
    return _compiled(_head(lit, think_end, reasoning_tokens) + "\n".join(lines) + "\n")


def _head(lit, think_end: str | None, reasoning_tokens: int) -> str:
    """The start rule: the calls, after reasoning where the reply opens inside a think block."""
    if think_end is None:
        return "start: calls\n"
    return (f"start: reasoning {lit(think_end)} /\\n{{0,2}}/ calls\n"
            f"reasoning[max_tokens={max(reasoning_tokens, 1)}]: /(.|\\n)*/\n")


def _dsml_calls(fmt: ToolFormat, functions: dict[str, dict[str, Any]], lit, parallel: bool,
                lenient: bool) -> str:
    """DeepSeek-V3.2's or V4's block (server/tools/dsml.py): each call's required parameters
    in the schema's order, then any of its others; a string parameter's value is text without
    "<" (an enum's: one of its values), any other's JSON of its schema."""
    from server.tools.formats import DSML_TOKEN

    dsml = lit(DSML_TOKEN)

    def tag(text: str, closing: bool = False) -> str:
        """<｜DSML｜text> (</｜DSML｜text> closing), the DSML token as the vocabulary has it."""
        return f'{json.dumps("</" if closing else "<")} {dsml} {json.dumps(text)}'

    rules = []
    for k, (name, schema) in enumerate(functions.items()):
        props = (schema or {}).get("properties") or {}
        required = [p for p in (schema or {}).get("required", []) if p in props]
        params = []
        for j, (key, prop) in enumerate(props.items()):
            params.append(f"p_{k}_{j}")
            # the key as the templates write it: raw between the quotes (tag escapes for Lark)
            opening = tag('parameter name="' + key + '" ')
            rules.append(f"p_{k}_{j}: {opening} "
                         f"{_dsml_value(prop if isinstance(prop, dict) else {}, lenient)} "
                         f"{tag('parameter>', True)} \"\\n\"")
        needed = " ".join(params[list(props).index(p)] for p in required)
        others = [params[j] for j, key in enumerate(props) if key not in required]
        rest = f" ({' | '.join(others)}){{0,{len(others)}}}" if others else ""
        invoke = tag('invoke name="' + name + '">')
        rules.append(f"fn_{k}: {invoke} \"\\n\" "
                     f"{needed}{rest} {tag('invoke>', True)}")
    alts = " | ".join(f"fn_{k}" for k in range(len(functions)))
    more = f' ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else ""
    block = fmt.section_end.split(DSML_TOKEN)[1]  # "function_calls>" or "tool_calls>"
    calls = f'calls: {tag(block)} "\\n" call{more} "\\n" {tag(block, True)}'
    lines = [calls, f"call: {alts}", *rules]
    return "\n".join(lines) + "\n"


def _dsml_value(prop: dict[str, Any], lenient: bool) -> str:
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        values = " | ".join(json.dumps(v) for v in enum)
        return f'"string=\\"true\\">" ({values})'
    if prop.get("type") == "string" and not enum:
        return '"string=\\"true\\">" /[^<]*/'
    schema = {**(prop if lenient else closed_objects(prop)), "x-guidance": JSON_OPTIONS}
    return f'"string=\\"false\\">" %json {json.dumps(schema)}'


def _fence_open(fmt: ToolFormat) -> str:
    return '"\\n" ' if fmt.fenced else ""


def _fence_close(fmt: ToolFormat) -> str:
    return '"\\n```" ' if fmt.fenced else ""


def _compiled(lark: str) -> str:
    """The grammar as the engine's matchers take it; RequestRejected (a 400) if llguidance
    refuses it (a parameter schema it cannot use)."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, RuntimeError) as e:
        raise RequestRejected(f"the tools cannot be turned into a grammar: "
                              f"{' '.join(str(e).split())[:300]}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        reason = " ".join(str(messages[0]).split())[:300]
        raise RequestRejected(f"the tools' parameter schemas cannot be used to constrain the "
                              f"call: {reason}; fix the schemas or use tool_choice auto")
    return grammar
