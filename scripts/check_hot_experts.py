"""GPU-held hot experts, and layers whose experts live wholly on the GPU, give the all-CPU
experts' greedy tokens, with CUDA graphs on.

    python scripts/check_hot_experts.py [--preset tiny-v3]

Writes the preset's Q4_K_M model, then decodes the same prompts with DeepSeek-V3.yaml's layout
(CPU experts in exact mode), with a quarter of each layer's experts held on the GPU, and with
every other MoE layer's experts moved wholly to the GPU (run in place, as
DeepSeek-V3-gpu-experts.yaml writes it), and prints whether the tokens match and whether the
decode steps were captured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import build_model, rules_with_mode

from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.rules.planner import plan_model
from hybrid.tuning.rules_writer import experts_rule, hot_expert_rules, write_rules


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-v3")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    path = build_model(args.preset, folder)
    base = rules_with_mode("DeepSeek-V3", "exact")
    planned = plan_model(path, base, check_devices=False, announce=False)
    e = planned.spec.num_experts
    hot = {layer: list(range(0, e, 4)) for layer in planned.spec.moe_layers}
    rules = write_rules(planned.rules_path, hot_expert_rules(planned.plan, hot, "cuda:0"),
                        folder / "hot.yaml", "check")
    moved = [experts_rule(layer, {"generate_device": "cuda:0", "prefill_device": "cuda:0",
                                  "backend": "torch"})
             for layer in planned.spec.moe_layers[::2]]
    whole = write_rules(planned.rules_path, moved, folder / "whole.yaml", "check")
    prompts = [[0, 5, 9, 11, 300], [0, 17, 2, 90], [0, 44] * 6]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=0, ignore_eos=True)
    results, ok = [], True
    for name, r in (("cpu experts", base), ("hot experts", str(rules)),
                    ("whole layers in place", str(whole))):
        llm = LLM(path, r)
        out = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        graphs = llm.engine.runner.graphs is not None
        results.append([o.outputs[0] for o in out])
        print(f"{name}: CUDA graphs {'captured' if graphs else 'off'}")
        ok &= graphs
        del llm
    for name, got in zip(("hot experts", "whole layers in place"), results[1:]):
        same = all(a.token_ids == b.token_ids for a, b in zip(results[0], got))
        worst = max(max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs))
                    for a, b in zip(results[0], got))
        print(f"{name} vs CPU experts: tokens {'equal' if same else 'DIFFER'}, "
              f"max |logprob diff| {worst:.2e}")
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
