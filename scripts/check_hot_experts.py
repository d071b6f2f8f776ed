"""GPU-held hot experts give the all-CPU experts' greedy tokens, with CUDA graphs on.

    python scripts/check_hot_experts.py [--preset tiny-v3]

Writes the preset's Q4_K_M model, then decodes the same prompts with DeepSeek-V3.yaml's layout
(CPU experts in exact mode) without and with a quarter of each layer's experts on the GPU, and
prints whether the tokens match and whether every step was captured.
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
from hybrid.engine.sampling_params import SamplingParams
from hybrid.rules.engine import plan_model
from hybrid.tuning.rules_writer import hot_expert_rules, write_rules


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
    prompts = [[0, 5, 9, 11, 300], [0, 17, 2, 90], [0, 44] * 6]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=0, ignore_eos=True)
    results = []
    for name, r in (("cpu experts", base), ("hot experts", str(rules))):
        llm = LLM(path, r)
        out = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        graphs = llm.engine.runner.graphs is not None
        results.append([o.outputs[0] for o in out])
        print(f"{name}: CUDA graphs {'captured' if graphs else 'off'}")
    same = all(a.token_ids == b.token_ids for a, b in zip(*results))
    worst = max(max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs))
                for a, b in zip(*results))
    print(f"hot experts vs CPU experts: tokens {'equal' if same else 'DIFFER'}, "
          f"max |logprob diff| {worst:.2e}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
