"""`hybrid profile` and `hybrid tune`: record which experts a workload uses, then place the
most used ones on the GPU within its memory budget (hybrid/tuning)."""

from __future__ import annotations

import argparse
import sys


def cmd_profile(args: argparse.Namespace) -> int:
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.tuning.run_profile import profile_prompts, read_prompts
    from server.cli import progress_bar

    prompts = read_prompts(args.prompts)
    config = EngineConfig(max_batch_size=args.batch, record_routing=True, prefix_cache=False)
    llm = LLM(args.gguf_path, args.optimize_rules, progress=progress_bar("loading"),
              engine_config=config)
    profile = profile_prompts(llm, prompts, args.max_tokens, args.temperature, args.batch,
                              progress=progress_bar("prompts", unit="prompt"))
    profile.save(args.out)
    print(f"wrote {args.out}: {profile.prefill_tokens} prompt and {profile.decode_tokens} "
          f"decode tokens over {len(profile.layers)} MoE layers", file=sys.stderr)
    return 0


def add_tune_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="record which experts each layer's router chooses over "
                                       "a file of prompts")
    p.add_argument("--gguf-path", default=None, help="the model (default: the demo model)")
    p.add_argument("--optimize-rules", default=None)
    p.add_argument("--prompts", required=True,
                   help='JSON lines: {"prompt": "..."}, {"messages": [...]} or a string')
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--batch", type=int, default=16, help="prompts in flight at once")
    p.add_argument("--out", required=True, help="the profile's JSON file")
    p.set_defaults(func=cmd_profile)
