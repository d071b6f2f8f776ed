"""`hybrid tune`'s target: on a skewed V2-Lite-shaped file with a GPU budget that holds a quarter
of the experts, decode with the tuned rules against no hot experts and against the same bytes as
whole layers (llama.cpp's --n-cpu-moe), predicted beside measured, in one run.

    python scripts/bench_tune.py [--preset moonlight] [--skew 0.6] [--mode exact|fast]
        [--prompts 32] [--folder DIR] [--device-map cuda=cpu] [--json out.json]

The model is make-model's preset (moonlight: V2-Lite's 64 experts, 6 chosen, with V3-style
routers that take --router-skew) at Q4_K_M; its routing profile comes from `prompts` generated
prompts of 24-96 words, 48 tokens each; the base rule file is DeepSeek-V3.yaml's layout with the
CPU experts in `mode`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import rules_with_mode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="moonlight")
    ap.add_argument("--skew", type=float, default=0.6)
    ap.add_argument("--mode", choices=["exact", "fast"], default="exact")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--cache-lens", type=int, default=4096)
    ap.add_argument("--folder", default="/tmp/tune")
    ap.add_argument("--device-map", default=None)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from hybrid.rules.devices import parse_device_map
    from hybrid.rules.explain import GPU_RESERVE_BYTES, explain
    from hybrid.rules.planner import plan_model
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.prompts import word_prompts
    from hybrid.synth.vocab import get_vocab
    from hybrid.tuning.planner import expert_bytes
    from hybrid.tuning.report import summary, to_json
    from hybrid.tuning.run_profile import profile_on_fresh_engine
    from hybrid.tuning.tune import TuneOptions, tune

    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    p = get_preset(args.preset)
    t = time.perf_counter()
    (path,) = make_model(MakeModelOptions(p, "q4_k_m", router_skew=args.skew),
                         get_vocab("small", p.vocab_size), folder / f"{p.name}-skew.gguf")
    print(f"make-model {p.name} --router-skew {args.skew}: {time.perf_counter() - t:.0f} s",
          flush=True)
    base = rules_with_mode("DeepSeek-V3", args.mode)
    device_map = parse_device_map(args.device_map)
    t = time.perf_counter()
    profile = profile_on_fresh_engine(str(path), base, word_prompts(args.prompts), 48,
                                      args.cache_lens, device_map)
    profile.save(folder / "profile.json")
    print(f"profile: {profile.prefill_tokens} prompt + {profile.decode_tokens} decode tokens, "
          f"{time.perf_counter() - t:.0f} s", flush=True)
    planned = plan_model(str(path), base, check_devices=False, announce=False)
    sizes = expert_bytes(planned.plan, p.num_experts)
    fixed = explain(planned.plan, planned.spec, args.cache_lens, 1 << 50,
                    None).devices["cuda:0"]
    quarter = sum(sizes.per_layer.values()) * p.num_experts // 4
    budget = fixed.weights + fixed.kv_cache + GPU_RESERVE_BYTES + quarter
    opts = TuneOptions(str(path), str(folder / "profile.json"), budget, folder / "tuned.yaml",
                       base, args.cache_lens, fractions=(), measure=True, steps=args.steps,
                       device_map=device_map)
    result = tune(opts, status=lambda s: print(s, flush=True))
    print(f"GPU budget {budget / 2**30:.2f} GiB: a quarter of the routed experts "
          f"({quarter / 2**30:.2f} GiB) beside the fixed parts, KV cache and reserve")
    print(summary(result))
    if args.json:
        Path(args.json).write_text(json.dumps({"budget": budget, **to_json(result)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
