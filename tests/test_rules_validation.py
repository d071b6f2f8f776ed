"""Every invalid rule file gives one message naming the file, line, rule and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid.rules.schema import RuleError, load_rules, parse_rules

GOOD = """
- match: {name: "^model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.experts$"}
  replace: {class: experts, kwargs: {generate_device: cpu, mode: fast}}
  recursive: false
"""

INVALID = {
    "empty file": ("", "the rule file is empty"),
    "comment only": ("# nothing\n", "the rule file is empty"),
    "not a list": ("match: {name: x}\n", ":1: the file must be a YAML list of rules"),
    "empty list": ("[]\n", "the rule list is empty"),
    "bad yaml": ("- match: {name: [unclosed\n", "not valid YAML"),
    "rule not a mapping": ("- just a string\n", "rule 1: the rule must be a mapping"),
    "missing replace": ("- match: {name: x}\n", "rule 1: 'replace' is missing"),
    "missing match": ("- replace: {class: default}\n", "rule 1: 'match' is missing"),
    "unknown rule key": ("- match: {name: x}\n  replace: {class: default}\n  recursiv: false\n",
                         ":3: rule 1: unknown key 'recursiv' in the rule; did you mean 'recursive'?"),
    "empty match": ("- match: {}\n  replace: {class: default}\n",
                    "rule 1: match needs 'name' (a regex) or 'class' or both"),
    "bad regex": ("- match: {name: 'layers.(['}\n  replace: {class: default}\n",
                  "rule 1: match.name 'layers.([' is not a valid regex"),
    "unknown operator": ("- match: {name: x}\n  replace: {class: expert}\n",
                         "rule 1: unknown operator 'expert'; did you mean 'experts'?"),
    "missing operator": ("- match: {name: x}\n  replace: {kwargs: {}}\n",
                         "rule 1: replace.class is missing"),
    "unknown kwarg": ("- match: {name: x}\n  replace: {class: gate, kwargs: {mode: fast}}\n",
                      "rule 1: unknown key 'mode' in kwargs of 'gate'; allowed: generate_device"),
    "wrong kwarg type": ("- match: {name: x}\n  replace: {class: experts, kwargs: {gpu_experts: 3}}\n",
                         "rule 1: kwargs.gpu_experts must be a list, got 3"),
    "bad choice": ("- match: {name: x}\n  replace: {class: experts, kwargs: {mode: turbo}}\n",
                   "rule 1: kwargs.mode is 'turbo'; choose one of exact, fast"),
    "bad activations": ("- match: {name: x}\n  replace: {class: mlp, kwargs: {activations: fp16}}\n",
                        "rule 1: kwargs.activations is 'fp16'; choose one of int16, int8, fp32"),
    "bad device": ("- match: {name: x}\n  replace: {class: default, kwargs: {generate_device: gpu}}\n",
                   "rule 1: kwargs.generate_device: device 'gpu' is not cpu, cuda or cuda:N"),
    "device not a string": ("- match: {name: x}\n  replace: {class: default, kwargs: {generate_device: 0}}\n",
                            "rule 1: kwargs.generate_device must be a str, got 0"),
    "recursive not bool": ("- match: {name: x}\n  replace: {class: default}\n  recursive: 'no'\n",
                           "rule 1: recursive must be true or false, got 'no'"),
    "name not a string": ("- match: {name: 5}\n  replace: {class: default}\n",
                          "rule 1: match.name must be a string, got 5"),
    "unknown class": ("- match: {class: DeepseekV3Atention}\n  replace: {class: default}\n",
                      ("rule 1: match.class 'DeepseekV3Atention' is not a known module class; "
                      "did you mean 'DeepseekV3Attention'?")),
    "duplicate conflicting": (
        ("- match: {name: x}\n  replace: {class: default}\n"
        "- match: {name: x}\n  replace: {class: default, kwargs: {generate_device: cuda}}\n"),
        ":3: rule 2 has the same match as rule 1 (line 1) but can never apply"),
    "duplicate identical": (
        ("- match: {name: x}\n  replace: {class: default}\n"
        "- match: {name: x}\n  replace: {class: default}\n"),
        "rule 2 repeats rule 1 (line 1)"),
    "attention backend moved": (
        "- match: {name: x}\n  replace: {class: mla_attention, kwargs: {backend: torch}}\n",
        ("rule 1: kwargs.backend of 'mla_attention': the decode attention kernel is the "
         "server's choice: `hybrid serve --attention-backend`")),
    "gpu_experts negative": (
        "- match: {name: x}\n  replace: {class: experts, kwargs: {gpu_experts: [1, -2]}}\n",
        "kwargs.gpu_experts must list expert ids (>= 0)"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_rule_file(case: str) -> None:
    text, message = INVALID[case]
    with pytest.raises(RuleError) as info:
        parse_rules(text, "rules.yaml")
    assert str(info.value).startswith("rules.yaml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_valid_rule_and_its_fields() -> None:
    (rule,) = parse_rules(GOOD, "rules.yaml")
    assert (rule.index, rule.line, rule.operator, rule.recursive) == (1, 2, "experts", False)
    assert rule.kwargs == {"generate_device": "cpu", "mode": "fast"}


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="cannot read the rule file"):
        load_rules(tmp_path / "nope.yaml")


def test_prefill_device_follows_generate_device_and_a_different_one_is_warned_of(
        models, tmp_path: Path) -> None:
    from hybrid.rules.planner import plan_model

    rules = tmp_path / "apart.yaml"
    rules.write_text(
        "- match: {name: '^model\\.layers\\..*\\.mlp\\.experts$'}\n"
        "  replace: {class: experts, kwargs: {generate_device: cpu, prefill_device: cuda}}\n"
        "- match: {name: '^lm_head$'}\n"
        "  replace: {class: lm_head, kwargs: {generate_device: cpu}}\n")
    planned = plan_model(str(models.path("tiny-v3", "q4_k_m")), str(rules), check_devices=False,
                         announce=False)
    places = planned.plan.placements
    assert places["lm_head"].prefill_device == "cpu"  # follows generate_device
    (warning,) = [w for w in planned.plan.warnings if "prefill_device" in w]
    assert "apart.yaml: rule 1 (line 1): prefill_device cuda" in warning
    assert "is not generate_device cpu" in warning
    assert "--prefill-experts" in warning
