"""The `hybrid` command: make-model, generate, chat, rules, serve, bench (the last two in
cli/serve.py, profile and tune in cli/tune.py; chat's loop and remote client in cli/chat.py).

Every user error is a one-line `error: ...` on stderr and exit status 2, never a traceback.
Flag defaults come from the frozen config classes (`SamplingParams`, `MakeModelOptions`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from cli.cluster import add_cluster_parser
from cli.progress import progress_bar
from cli.serve import add_bench_parser, add_serve_parser
from cli.tune import add_tune_parsers
from hybrid.errors import HybridError
from hybrid.model.kv_budget import DEFAULT_CACHE_LENS


def _sampling_defaults():
    from hybrid.engine.sampling.sampling_params import SamplingParams

    return {f.name: f.default for f in fields(SamplingParams)}


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    d = _sampling_defaults()
    p.add_argument("--max-new-tokens", type=int, default=d["max_tokens"], help="tokens to generate")
    p.add_argument("--temperature", type=float, default=d["temperature"], help="0 = greedy")
    p.add_argument("--top-p", type=float, default=d["top_p"],
                   help="sample from the smallest set of tokens holding this much probability")
    p.add_argument("--top-k", type=int, default=d["top_k"], help="0 = off")
    p.add_argument("--min-p", type=float, default=d["min_p"], help="0 = off")
    p.add_argument("--presence-penalty", type=float, default=d["presence_penalty"], help="-2..2")
    p.add_argument("--frequency-penalty", type=float, default=d["frequency_penalty"],
                   help="-2..2")
    p.add_argument("--repetition-penalty", type=float, default=d["repetition_penalty"],
                   help="> 0; 1 = off")
    p.add_argument("--seed", type=int, default=d["seed"],
                   help="the sampler's seed (default: a fresh one each run)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _sampling_from(args: argparse.Namespace, logprobs: int | None = None):
    from hybrid.engine.sampling.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty, seed=args.seed,
        max_tokens=args.max_new_tokens, stop=tuple(args.stop), logprobs=logprobs,
    )


def _load_llm(args: argparse.Namespace):
    from hybrid.engine.llm import LLM

    return LLM(args.gguf_path, args.optimize_rules, progress=progress_bar("loading"))


def cmd_make_model(args: argparse.Namespace) -> int:
    from hybrid.synth.make_model import MakeModelOptions, make_model
    from hybrid.synth.presets import get_preset
    from hybrid.synth.presets_v4 import V4_PRESETS
    from hybrid.synth.vocab import get_vocab

    if args.preset in V4_PRESETS:
        return _make_v4(args)
    preset = get_preset(args.preset, args.layers)
    opts = MakeModelOptions(preset, args.quant, args.layout, args.seed, args.split, args.vocab,
                            args.header_only, args.chat_template, args.router_skew)
    out = Path(args.out)
    if out.suffix != ".gguf":
        out = out / f"{preset.name}-{args.quant}-{args.layout}.gguf"
    vocab = get_vocab(args.vocab, preset.vocab_size)
    bar = progress_bar("writing")
    files = make_model(opts, vocab, out, lambda name, done, total: bar(done, total))
    for f in files:
        print(f)
    return 0


def _make_v4(args: argparse.Namespace) -> int:
    """make-model for a DeepSeek-V4 preset (deepseek4 files have one layout, no splits yet)."""
    from hybrid.synth.make_v4 import make_v4
    from hybrid.synth.presets_v4 import V4_PRESETS, with_layers
    from hybrid.synth.vocab import get_vocab

    if args.split != 1:
        raise HybridError("--split is not supported for DeepSeek-V4 presets yet; leave it at 1")
    preset = V4_PRESETS[args.preset]
    if args.layers is not None:
        preset = with_layers(preset, args.layers)
    out = Path(args.out)
    if out.suffix != ".gguf":
        out = out / f"{preset.name}-{args.quant}.gguf"
    bar = progress_bar("writing")
    files = make_v4(preset, args.quant, args.seed, get_vocab(args.vocab, preset.vocab_size), out,
                    args.header_only, args.chat_template,
                    lambda name, done, total: bar(done, total))
    for f in files:
        print(f)
    return 0


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise HybridError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.prompt_ids is None):
        raise HybridError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    llm = _load_llm(args)
    params = _sampling_from(args, logprobs=0 if args.logprobs else None)
    if args.prompt_ids is not None:
        ids = _parse_ids(args.prompt_ids)
    elif args.chat_template:
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        ids = llm.tokenizer.encode(args.prompt)
    if args.json:
        out = llm.generate(prompt_token_ids=[ids], sampling_params=params)[0].outputs[0]
        print(json.dumps({
            "prompt_token_ids": ids, "token_ids": out.token_ids, "logprobs": out.logprobs,
            "text": out.text, "finish_reason": out.finish_reason,
        }, ensure_ascii=False))
        return 0
    for event in llm.stream(ids, params):
        sys.stdout.write(event.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from cli.chat import RemoteChat, chat_loop, openai_sampling
    from hybrid.engine.heap import freeze_start_up_heap

    params = _sampling_from(args)
    if args.url is not None:
        return chat_loop(RemoteChat(args.url, args.api_key, args.model, openai_sampling(params)),
                         args.system)
    llm = _load_llm(args)
    freeze_start_up_heap()  # this process holds one engine for its life (hybrid/engine/heap.py)

    def respond(messages: list[dict[str, str]]):
        for event in llm.stream(llm.tokenizer.encode_chat(messages), params):
            yield "", event.text

    return chat_loop(respond, args.system)


def cmd_rules_explain(args: argparse.Namespace) -> int:
    import psutil

    from hybrid.rules.explain import explain, parse_budgets, parse_size, render_table
    from hybrid.rules.planner import plan_model

    gguf_path = args.gguf_path
    if gguf_path is None:
        from hybrid.demo import demo_model_path

        gguf_path = str(demo_model_path())
    planned = plan_model(gguf_path, args.optimize_rules, check_devices=False,
                         announce=not args.json)
    cpu_memory = parse_size(args.cpu_memory) if args.cpu_memory else psutil.virtual_memory().total
    exp = explain(planned.plan, planned.spec, args.cache_lens, parse_budgets(args.gpu_memory),
                  cpu_memory)
    if args.json:
        print(json.dumps({"model": str(planned.gguf.path), "rules": str(planned.rules_path),
                          **exp.to_json()}, indent=2))
    else:
        header = f"model {planned.gguf.path.name} ({planned.spec.name}), rules {planned.rules_path.name}"
        print(render_table(exp, header))
    return 0 if exp.fits else 1  # scripts can test the verdict


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default (argparse's own formatter shows it only for
    options with a help text, and shows None and False too). Switches (--x, --no-x) show none:
    their help says what passing them does, and "(default: True)" beside --no-x misleads."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or "(default" in text or default in (None, False) \
                or default is argparse.SUPPRESS or not action.option_strings \
                or isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction,
                                       argparse._StoreFalseAction)):
            return text
        return f"{text} (default: %(default)s)".strip()


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from hybrid.synth.make_model import MakeModelOptions
    from hybrid.synth.make_v4 import V4_QUANTS
    from hybrid.synth.presets import PRESETS
    from hybrid.synth.presets_v4 import V4_PRESETS
    from hybrid.synth.recipe import QUANTS
    from hybrid.tokenizer.bundled_templates import BUNDLED_TEMPLATES

    parser = argparse.ArgumentParser(prog="hybrid", description="DeepSeek MoE inference on GPU + "
                                     "CPU", formatter_class=DefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    d = {f.name: f.default for f in fields(MakeModelOptions)}
    mk = sub.add_parser("make-model", help="write a synthetic DeepSeek GGUF with random weights")
    mk.add_argument("--preset", required=True, choices=[*PRESETS, *V4_PRESETS],
                    help="the model's shapes: tiny ones for tests, real ones (v2-lite, v3, ...) "
                         "for benchmarks and rules explain")
    mk.add_argument("--layers", type=int, default=None, help="override the layer count")
    mk.add_argument("--quant", default=d["quant"], choices=list(dict.fromkeys([*QUANTS,
                                                                                 *V4_QUANTS])),
                    help="the quant mix, as llama.cpp's recipes and unsloth's dynamic files "
                         "write them (DeepSeek-V4 presets: " + ", ".join(V4_QUANTS) + ")")
    mk.add_argument("--layout", default=d["layout"], choices=["legacy", "mla"],
                    help="legacy: attn_kv_b (most downloads); mla: attn_k_b and attn_v_b "
                         "(llama.cpp since April 2025)")
    mk.add_argument("--seed", type=int, default=d["seed"], help="the random weights' seed")
    mk.add_argument("--split", type=int, default=d["split"], help="write N split files")
    mk.add_argument("--vocab", default=d["vocab"], choices=["small", "deepseek"],
                    help="small: a short synthetic vocabulary; deepseek: DeepSeek's own "
                         "129K-token tokenizer")
    mk.add_argument("--header-only", action="store_true",
                    help="headers only, data left as a sparse hole: for rules explain, not to run")
    mk.add_argument("--router-skew", type=float, default=d["router_skew"], metavar="S",
                    help="each layer's experts chosen with Zipf(S) frequencies, in its own order "
                         "(V3-style routers; 0.6: a quarter of the experts take half the "
                         "activations); for `hybrid profile`/`hybrid tune` experiments")
    mk.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                    help="write a family's real chat template (" + ", ".join(BUNDLED_TEMPLATES)
                    + ") or a .jinja file instead of the built-in DeepSeek-V3 rendering")
    mk.add_argument("--out", required=True, help="a .gguf path, or a folder to write into")
    mk.set_defaults(func=cmd_make_model)

    rules = sub.add_parser("rules", help="inspect optimize rules").add_subparsers(
        dest="rules_command", required=True, parser_class=_Parser)
    ex = rules.add_parser("explain", help="what a rule file places where, and whether it fits")
    ex.add_argument("--gguf-path", default=None,
                    help="a .gguf file, split part or folder (default: the built-in demo model)")
    ex.add_argument("--optimize-rules", default=None,
                    help="a bundled rule file name or a path (default: the machine's default)")
    ex.add_argument("--cache-lens", type=int, default=DEFAULT_CACHE_LENS,
                    help="KV cache tokens to plan for (hybrid serve's at least this many)")
    ex.add_argument("--gpu-memory", default="24GiB",
                    help="budget per GPU: one size for all, or one each in device order "
                         "(24GiB,16GiB: cuda:0, cuda:1)")
    ex.add_argument("--cpu-memory", default=None, help="CPU budget (default: this machine's RAM)")
    ex.add_argument("--json", action="store_true", help="print one JSON object")
    ex.set_defaults(func=cmd_rules_explain)

    for name, func, help_text in (
        ("generate", cmd_generate, "complete a prompt"),
        ("chat", cmd_chat, "chat interactively (streaming, multi-turn)"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--gguf-path", default=None,
                       help="a .gguf file, split part or folder (default: the built-in demo model)")
        p.add_argument("--optimize-rules", default=None,
                       help="bundled rule file name or path (default: cpu.yaml without a GPU)")
        _add_sampling_flags(p)
        p.set_defaults(func=func)
        if name == "generate":
            p.add_argument("--prompt", default=None, help="the prompt text")
            p.add_argument("--prompt-ids", default=None, help="comma-separated token ids")
            p.add_argument("--chat-template", action="store_true",
                           help="wrap --prompt in the model's chat template as a user turn")
            p.add_argument("--logprobs", type=int, default=0, choices=[0, 1],
                           help="1: report each generated token's log-probability (--json)")
            p.add_argument("--json", action="store_true", help="print one JSON object")
        else:
            p.add_argument("--system", default=None, help="a system prompt")
            p.add_argument("--url", default=None,
                           help="chat with a running server (e.g. http://127.0.0.1:8000) instead "
                                "of loading a model")
            p.add_argument("--api-key", default=None, help="the server's key (with --url)")
            p.add_argument("--model", default=None,
                           help="the model name (with --url; default: the server's first)")
    add_serve_parser(sub)
    add_cluster_parser(sub)
    add_bench_parser(sub)
    add_tune_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HybridError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
