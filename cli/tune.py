"""`hybrid profile` and `hybrid tune`: record which experts a workload uses, then place the
most used ones on the GPU within its memory budget (hybrid/tuning)."""

from __future__ import annotations

import argparse
import sys


def cmd_profile(args: argparse.Namespace) -> int:
    from cli.progress import progress_bar
    from hybrid.engine.config import EngineConfig
    from hybrid.engine.llm import LLM
    from hybrid.tuning.run_profile import profile_prompts, read_prompts

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
    p.add_argument("--optimize-rules", default=None,
                   help="bundled rule file name or path (default: the machine's default)")
    p.add_argument("--prompts", required=True,
                   help='JSON lines: {"prompt": "..."}, {"messages": [...]} or a string')
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="sampling temperature of the profiled answers")
    p.add_argument("--batch", type=int, default=16, help="prompts in flight at once")
    p.add_argument("--out", required=True, help="the profile's JSON file")
    p.set_defaults(func=cmd_profile)
    _add_tune_parser(sub)


def cmd_tune(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from hybrid.model.kv_budget import DEFAULT_CACHE_LENS
    from hybrid.rules.devices import parse_device_map
    from hybrid.rules.explain import parse_budgets
    from hybrid.tuning.report import summary, to_json
    from hybrid.tuning.tune import TuneOptions, tune

    fractions = tuple(float(x) for x in args.budgets.split(",") if x.strip())
    threads = tuple(int(x) for x in args.sweep_threads.split(",") if x.strip())
    chunks = tuple(int(x) for x in args.sweep_chunk_sizes.split(",") if x.strip())
    device_map = parse_device_map(args.device_map)
    out = Path(args.out)
    gguf_path = args.gguf_path
    if gguf_path is None:  # as the help says: the demo model
        from hybrid.demo import demo_model_path

        gguf_path = str(demo_model_path())
    opts = TuneOptions(gguf_path, args.profile, parse_budgets(args.gpu_memory), out,
                       args.optimize_rules, args.cache_lens or DEFAULT_CACHE_LENS,
                       args.gpu_device, args.batch, args.phase, fractions, args.measure,
                       args.steps, threads, chunks, args.prefill_tokens, device_map,
                       args.cpu_bandwidth, args.repeats)
    result = tune(opts, status=lambda s: print(s, file=sys.stderr, flush=True))
    (out.with_suffix(".json")).write_text(json.dumps(to_json(result), indent=2))
    print(summary(result, args.batch))
    if not args.no_plots:
        try:
            from hybrid.tuning.plots import write_plots
        except ImportError:
            print("plots skipped: matplotlib is not installed (pip install matplotlib)",
                  file=sys.stderr)
        else:
            for path in write_plots(result, out.with_suffix(""), args.batch):
                print(f"plot: {path}")
    return 0


def _add_tune_parser(sub: argparse._SubParsersAction) -> None:
    from dataclasses import fields

    from hybrid.tuning.results import TuneOptions

    d = {f.name: f.default for f in fields(TuneOptions)}
    p = sub.add_parser("tune", help="place the experts a routing profile uses most on the GPU, "
                                    "within its memory: writes a rule file")
    p.add_argument("--gguf-path", default=None, help="the model (default: the demo model)")
    p.add_argument("--optimize-rules", default=None,
                   help="the base rule file whose CPU experts are tuned (default: the "
                        "bundled 24 GB GPU rules of the model's family, also on a machine "
                        "without a GPU)")
    p.add_argument("--profile", required=True, help="from `hybrid profile` or serve "
                                                    "--record-routing")
    p.add_argument("--gpu-memory", required=True,
                   help="the GPU's budget, e.g. 24GiB; or one per GPU in device order "
                        "(24GiB,24GiB: rules that keep their layers on one GPU are split over "
                        "cuda:0 and cuda:1 by layer ranges, and each GPU holds the experts its "
                        "layers use most)")
    p.add_argument("--cache-lens", type=int, default=None,
                   help="KV cache tokens to leave room for (default: serve's)")
    p.add_argument("--gpu-device", default=d["gpu_device"], help="where the hot experts go")
    p.add_argument("--batch", type=int, default=d["batch"],
                   help="requests decoding at once to tune for")
    p.add_argument("--phase", choices=["decode", "prefill"], default=d["phase"],
                   help="which tokens' routing to weigh")
    p.add_argument("--measure", action="store_true",
                   help="decode at several budgets and whole layers: predicted beside measured")
    p.add_argument("--budgets", default=",".join(map(str, d["fractions"])),
                   help="fractions of the free GPU memory to predict (and measure) besides "
                        "0 and all of it")
    p.add_argument("--sweep-threads", default="", help="with --measure: CPU thread counts to "
                                                       "time, e.g. 4,8,16")
    p.add_argument("--sweep-chunk-sizes", default="", help="with --measure: --chunk-size values "
                                                           "to time prefill at, e.g. 512,2048")
    p.add_argument("--prefill-tokens", type=int, default=d["prefill_tokens"],
                   help="the prompt the chunk sizes prefill")
    p.add_argument("--steps", type=int, default=d["steps"],
                   help="decode steps timed per measurement")
    p.add_argument("--repeats", type=int, default=d["repeats"],
                   help="with --measure: rounds over every placement, medians kept (a shared "
                        "host drifts between engines)")
    p.add_argument("--device-map", default=None, metavar="FROM=TO",
                   help="with --measure: run the rule files' devices elsewhere (cuda=cpu)")
    p.add_argument("--cpu-bandwidth", type=float, default=None, metavar="GB/s",
                   help="the CPU's read bandwidth for the CPU-time floor (default: measured now)")
    p.add_argument("--no-plots", action="store_true",
                   help="write no PNG plots beside the rule file")
    p.add_argument("--out", required=True, help="the rule file to write (.yaml)")
    p.set_defaults(func=cmd_tune)
