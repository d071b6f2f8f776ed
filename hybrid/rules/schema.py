"""Read and validate an optimize-rule file into frozen `Rule`s.

A rule file is a YAML list; each rule has `match` (`name`: a regex searched in the dotted module
path; `class`: a class name or dotted path, or a list of them (any may match); both must hold
when both are given), `replace`
(`class`: an operator name or `default`; `kwargs`: that operator's options) and `recursive`
(default true). Every problem is a `RuleError` naming the file, the line, the rule and the fix.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hybrid.errors import HybridError
from hybrid.ops.registry import OPERATORS
from hybrid.rules.devices import parse_device


class RuleError(HybridError):
    pass


@dataclass(frozen=True)
class Rule:
    index: int  # 1-based position in the file
    line: int  # 1-based line of the rule
    name_regex: str | None
    class_names: tuple[str, ...] | None
    operator: str
    kwargs: dict[str, Any] = field(hash=False)
    recursive: bool = True

    @property
    def label(self) -> str:
        return f"rule {self.index} (line {self.line})"

    def matches(self, path: str, module_class: type) -> bool:
        if self.name_regex is not None and re.search(self.name_regex, path) is None:
            return False
        if self.class_names is None:
            return True
        return any(_class_matches(name, module_class) for name in self.class_names)


def _class_matches(name: str, cls: type) -> bool:
    if "." in name:
        return any(f"{c.__module__}.{c.__qualname__}" == name for c in cls.__mro__)
    return any(c.__name__ == name for c in cls.__mro__)


_RULE_KEYS = ("match", "replace", "recursive")
_MATCH_KEYS = ("name", "class")
_REPLACE_KEYS = ("class", "kwargs")


def load_rules(path: Path) -> list[Rule]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RuleError(f"{path}: cannot read the rule file ({e.strerror})") from None
    return parse_rules(text, str(path))


def parse_rules(text: str, source: str) -> list[Rule]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RuleError(f"{source}{where}: not valid YAML ({problem}); fix the syntax there") from None
    if root is None:
        raise RuleError(f"{source}: the rule file is empty; it must be a list of rules "
                        "(see docs/optimize-rules.md)")
    if not isinstance(root, yaml.SequenceNode):
        raise RuleError(f"{source}:{root.start_mark.line + 1}: the file must be a YAML list of rules "
                        "(each starting with '- match:')")
    rules = [_parse_rule(node, i + 1, source) for i, node in enumerate(root.value)]
    if not rules:
        raise RuleError(f"{source}: the rule list is empty; add at least one rule")
    _check_conflicts(rules, source)
    return rules


def _err(source: str, node: yaml.Node, index: int, problem: str) -> RuleError:
    return RuleError(f"{source}:{node.start_mark.line + 1}: rule {index}: {problem}")


def _mapping(node: yaml.Node, source: str, index: int, what: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise _err(source, node, index, f"{what} must be a mapping of {', '.join(allowed)}")
    out: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else f"allowed: {', '.join(allowed)}"
            raise _err(source, key_node, index, f"unknown key '{key}' in {what}; {fix}")
        if key in out:
            raise _err(source, key_node, index, f"key '{key}' appears twice in {what}")
        out[key] = value_node
    return out


def _construct(node: yaml.Node) -> Any:
    return yaml.SafeLoader("").construct_object(node, deep=True)


def _scalar(node: yaml.Node, source: str, index: int, what: str, kind: type) -> Any:
    value = _construct(node)
    if kind is str and not isinstance(value, str):
        raise _err(source, node, index, f"{what} must be a string, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise _err(source, node, index, f"{what} must be true or false, got {value!r}")
    return value


def _parse_rule(node: yaml.Node, index: int, source: str) -> Rule:
    rule = _mapping(node, source, index, "the rule", _RULE_KEYS)
    for key in ("match", "replace"):
        if key not in rule:
            raise _err(source, node, index, f"'{key}' is missing; every rule needs match and replace")
    match = _mapping(rule["match"], source, index, "match", _MATCH_KEYS)
    if not match:
        raise _err(source, rule["match"], index, "match needs 'name' (a regex) or 'class' or both")
    name = _scalar(match["name"], source, index, "match.name", str) if "name" in match else None
    if name is not None:
        try:
            re.compile(name)
        except re.error as e:
            raise _err(source, match["name"], index,
                       f"match.name {name!r} is not a valid regex ({e}); escape dots as \\\\.") from None
    classes = None
    if "class" in match:
        raw = _construct(match["class"])
        classes = tuple(raw) if isinstance(raw, list) else (raw,)
        if not classes or not all(isinstance(c, str) for c in classes):
            raise _err(source, match["class"], index,
                       f"match.class must be a class name or a list of them, got {raw!r}")
        for c in classes:
            _check_class_name(c, source, match["class"], index)
    replace = _mapping(rule["replace"], source, index, "replace", _REPLACE_KEYS)
    if "class" not in replace:
        raise _err(source, rule["replace"], index,
                   "replace.class is missing; name an operator or 'default'")
    op = _scalar(replace["class"], source, index, "replace.class", str)
    if op not in OPERATORS:
        hint = difflib.get_close_matches(op, list(OPERATORS), n=1)
        fix = f"did you mean '{hint[0]}'?" if hint else f"known: {', '.join(OPERATORS)}"
        raise _err(source, replace["class"], index, f"unknown operator '{op}'; {fix}")
    kwargs = _parse_kwargs(replace.get("kwargs"), op, source, index)
    recursive = True
    if "recursive" in rule:
        recursive = _scalar(rule["recursive"], source, index, "recursive", bool)
    return Rule(index, node.start_mark.line + 1, name, classes, op, kwargs, recursive)


# options a rule could once set that now belong elsewhere: (operator, key) -> where they went
_MOVED_OPTIONS = {("mla_attention", "backend"): "the decode attention kernel is the server's "
                  "choice: `hybrid serve --attention-backend`; remove it from the rule"}


def _parse_kwargs(node: yaml.Node | None, op: str, source: str, index: int) -> dict[str, Any]:
    if node is None:
        return {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if (op, key_node.value) in _MOVED_OPTIONS:
                raise _err(source, key_node, index, f"kwargs.{key_node.value} of '{op}': "
                           f"{_MOVED_OPTIONS[op, key_node.value]}")
    raw = _mapping(node, source, index, f"kwargs of '{op}'", tuple(OPERATORS[op].options))
    spec = OPERATORS[op]
    kwargs: dict[str, Any] = {}
    for key, value_node in raw.items():
        value = _construct(value_node)
        opt = spec.options[key]
        if not isinstance(value, opt.type) or isinstance(value, bool) != (opt.type is bool):
            want = opt.type.__name__ if isinstance(opt.type, type) else "value"
            raise _err(source, value_node, index, f"kwargs.{key} must be a {want}, got {value!r}")
        if opt.choices is not None and value not in opt.choices:
            raise _err(source, value_node, index,
                       f"kwargs.{key} is {value!r}; choose one of {', '.join(map(str, opt.choices))}")
        if key.endswith("_device"):
            try:
                parse_device(value)
            except HybridError as e:
                raise _err(source, value_node, index, f"kwargs.{key}: {e}") from None
        if key == "gpu_experts" and not all(isinstance(x, int) and x >= 0 for x in value):
            raise _err(source, value_node, index, "kwargs.gpu_experts must list expert ids (>= 0)")
        kwargs[key] = value
    return kwargs


def _check_class_name(cls: str, source: str, node: yaml.Node, index: int) -> None:
    from hybrid.rules.classes import known_class_names

    if "." in cls or cls in known_class_names():
        return
    hint = difflib.get_close_matches(cls, sorted(known_class_names()), n=1)
    fix = f"did you mean '{hint[0]}'?" if hint else "use a transformers DeepSeek class or a dotted path"
    raise _err(source, node, index, f"match.class '{cls}' is not a known module class; {fix}")


def _check_conflicts(rules: list[Rule], source: str) -> None:
    seen: dict[tuple, Rule] = {}
    for rule in rules:
        key = (rule.name_regex, rule.class_names)
        first = seen.get(key)
        if first is None:
            seen[key] = rule
            continue
        same = (first.operator, first.kwargs, first.recursive) == (rule.operator, rule.kwargs,
                                                                   rule.recursive)
        what = "repeats" if same else "has the same match as"
        raise RuleError(
            f"{source}:{rule.line}: rule {rule.index} {what} {first.label} but can never apply "
            f"(the first match wins); delete one of them"
        )
