"""GPU machine check of the rules path: real CUDA placements equal the CPU reference.

Per tiny preset and layout: the transformers-interface forward's logits against the CPU
reference model, and the serving engine's greedy tokens with CUDA rules (whole-step CUDA
graphs, per-layer graphs and none; 4 concurrent requests, so decodes share a graph of batch 4)
against cpu.yaml's, in exact mode; and fast mode's greedy tokens, whole-step graphs against
per-layer ones; and that serving them compiled no Triton kernel variant that start-up had not
(odd prompt lengths, mixed steps, batch 1 and 4). Run on the GPU machine (see scripts/device_rules_check.sh). Writes
$OUT/rules_check.json and prints a short table last.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels.jit_cache import compiled_variants, new_variants
from gpu_kernels.mla_decode_flashinfer import available
from hybrid.engine.config import EngineConfig
from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.model.loader import load_model
from hybrid.rules.inject import inject
from hybrid.rules.planner import (
    plan_model,
    with_deferral,
    with_experts_mode,
    with_kv_cache_dtype,
)
from hybrid.synth.make_model import MakeModelOptions, make_model
from hybrid.synth.presets import get_preset
from hybrid.synth.vocab import get_vocab

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WORK = Path("/tmp/models")
PROMPT = [0, 42, 574, 81, 2058, 3, 223, 804, 853, 303, 3427, 223]


def build(preset: str, quant: str, layout: str, vocab: str = "small") -> str:
    p = get_preset(preset)
    t = time.perf_counter()
    (path,) = make_model(MakeModelOptions(p, quant, layout, vocab=vocab),
                         get_vocab(vocab, p.vocab_size), WORK / f"{preset}-{quant}-{layout}.gguf")
    print(f"make-model {preset} {quant} {layout}: {time.perf_counter() - t:.1f} s", flush=True)
    return str(path)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


PROMPTS = [PROMPT, PROMPT[:5], [0, 9, 99, 999], PROMPT[3:] * 3]


def greedy(path: str, rules: str, graphs: bool = True, decode_graph: str = "step",
           alone: bool = False, late: dict | None = None,
           attention: str = "triton") -> list[list[int]]:
    """Greedy tokens of PROMPTS, decoded together (a batch of 4) or each alone (batch 1: the
    one-token products, int16 x on Q4_K). `late` gathers the Triton variants compiled after
    start-up (odd prompt lengths, mixed steps: there should be none)."""
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = LLM(path, rules, engine_config=EngineConfig(cuda_graphs=graphs, max_batch_size=8,
                                                      chunk_size=64, cache_lens=4096,
                                                      decode_graph=decode_graph,
                                                      attention_backend=attention))
    before = compiled_variants()
    batches = [[p] for p in PROMPTS] if alone else [PROMPTS]
    out = [o.outputs[0].token_ids for b in batches
           for o in llm.generate(prompt_token_ids=b, sampling_params=params)]
    if late is not None:
        for k, n in new_variants(before, compiled_variants()).items():
            late[k] = late.get(k, 0) + n
    return out


def check_equal(path: str, rules: str, kv_f32: bool = False) -> dict:
    """`kv_f32`: the exact rules keep an f32 KV cache (DeepSeek-V3.2: the bf16 cache moves the
    indexer's scores by ~1e-3, enough to swap two keys tied at the top-k's edge, a different and
    equally valid selection, so only the f32 cache gives cpu.yaml's tokens)."""
    fast = rules
    rules = str(with_experts_mode(rules, "exact", WORK))  # the bundled GPU files serve fast
    if kv_f32:
        rules = str(with_kv_cache_dtype(rules, "f32", WORK))
    ref = load_model(path).model
    model = inject(plan_model(path, rules, announce=False))
    devices = sorted({str(t.device) for m in model.modules() for t in vars(m).values()
                      if isinstance(t, torch.Tensor)})
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        err = rel_l2(model(input_ids=ids).logits[0].cpu(), ref(input_ids=ids).logits[0])
    del model, ref
    cpu = greedy(path, "cpu")
    late: dict[str, int] = {}
    gpu = greedy(path, rules, late=late)
    alone = greedy(path, rules, alone=True, late=late)
    eager = greedy(path, rules, graphs=False, late=late)
    layers = greedy(path, rules, decode_graph="layers", late=late)
    timed = greedy(path, rules, decode_graph="auto", late=late)  # the faster of the two
    # fast experts: the whole step's one-call driver runs the kernels run_inline runs
    fast_step = greedy(path, fast, late=late)
    fast_layers = greedy(path, fast, decode_graph="layers", late=late)
    same = [a == b for a, b in zip(gpu, cpu)]
    same_alone = [a == b for a, b in zip(alone, cpu)]
    return {"model": Path(path).name, "rules": Path(rules).stem, "rel_l2": err,
            "greedy_equal": f"{sum(same)}/{len(same)}",
            "batch1_greedy_equal": f"{sum(same_alone)}/{len(same_alone)}",
            "graphs_equal_eager": gpu == eager == layers == timed, "fast_step_equal_layers":
            fast_step == fast_layers, "compiled_after_start": late, "devices": devices}


def check_deferral(path: str, rules: str, k: int) -> dict:
    """Expert deferral (`defer_experts: k`) on every path: exact experts in step graphs (the
    host's Python loop), layer graphs and eager steps give cpu.yaml's deferred tokens; fast
    experts in a step graph (the one-region driver computing the deferred experts while the
    GPU runs on) give the layer graphs' and eager steps' tokens."""
    exact = str(with_deferral(str(with_experts_mode(rules, "exact", WORK)), k, WORK))
    fast = str(with_deferral(rules, k, WORK))
    cpu = greedy(path, str(with_deferral("cpu", k, WORK)))
    step, layers = greedy(path, exact), greedy(path, exact, decode_graph="layers")
    eager = greedy(path, exact, graphs=False)
    fast_step, fast_layers = greedy(path, fast), greedy(path, fast, decode_graph="layers")
    fast_eager = greedy(path, fast, graphs=False)
    exact_undeferred = greedy(path, str(with_experts_mode(rules, "exact", WORK)))
    same = [a == b for a, b in zip(step, cpu)]
    moved = [a != b for a, b in zip(step, exact_undeferred)]
    return {"model": Path(path).name, "rules": f"{Path(rules).stem}, defer_experts {k}",
            "greedy_equal_cpu": f"{sum(same)}/{len(same)}",
            "graphs_equal_eager": step == layers == eager,
            "fast_step_equal_layers": fast_step == fast_layers == fast_eager,
            "differs_from_exact": f"{sum(moved)}/{len(moved)}"}


def check_flashinfer() -> dict:
    """flashinfer's decode attention against ours in the engine: greedy tokens of a tiny V3
    with DeepSeek's own attention dims (512 latent + 64 rope, which flashinfer's MLA kernels
    take; the tiny presets are narrower) and 16 heads, in step graphs, layer graphs and eager
    steps."""
    p = dataclasses.replace(get_preset("tiny-v3"), kv_lora_rank=512, qk_rope_head_dim=64,
                            num_heads=16)
    (path,) = make_model(MakeModelOptions(p, "q4_k_m", "legacy"), get_vocab("small", p.vocab_size),
                         WORK / "tiny-v3-512-q4_k_m.gguf")
    path = str(path)
    ours = greedy(path, "DeepSeek-V3")
    fi = {"step": greedy(path, "DeepSeek-V3", attention="flashinfer"),
          "layers": greedy(path, "DeepSeek-V3", decode_graph="layers", attention="flashinfer"),
          "eager": greedy(path, "DeepSeek-V3", graphs=False, attention="flashinfer")}
    return {"model": Path(path).name, **{f"flashinfer_{k}_equal_ours":
                               f"{sum(a == b for a, b in zip(v, ours))}/{len(v)}"
                               for k, v in fi.items()}}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    only_flashinfer = os.environ.get("ONLY") == "flashinfer"
    cases = (("tiny-v3", "q4_k_m", "legacy", "DeepSeek-V3"),
             ("tiny-v3", "q4_k_m", "mla", "DeepSeek-V3-gpu-experts"),
             ("tiny-v2-lite", "q4_k_m", "mla", "DeepSeek-V2-Lite"),
             ("tiny-v32", "q4_k_m", "mla", "DeepSeek-V3.2"))
    # CASES=N: the first N cases only (a short check when device time is scarce);
    # PRESETS=a,b: the cases of those presets only
    cases = () if only_flashinfer or os.environ.get("ONLY") == "deferral" \
        else cases[:int(os.environ.get("CASES", len(cases)))]
    if os.environ.get("PRESETS"):
        cases = tuple(c for c in cases if c[0] in os.environ["PRESETS"].split(","))
    for preset, quant, layout, rules in cases:
        rows.append(check_equal(build(preset, quant, layout), rules,
                                kv_f32=get_preset(preset).arch == "deepseek32"))
        print(rows[-1], flush=True)
    # DEFER=k (default 2; 0: skip): expert deferral on the tiny V2-Lite (top 2: k 1) and V3 (top 4)
    defer = int(os.environ.get("DEFER", "2"))
    deferral = [check_deferral(build(preset, "q4_k_m", layout), rules,
                               min(defer, get_preset(preset).num_experts_per_tok - 1))
                for preset, layout, rules in (("tiny-v2-lite", "mla", "DeepSeek-V2-Lite"),
                                              ("tiny-v3", "legacy", "DeepSeek-V3"))
                if defer and not only_flashinfer] if os.environ.get("ONLY") != "rules" else []
    for r in deferral:
        print(r, flush=True)
    fi = check_flashinfer() if available() and os.environ.get("ONLY") != "deferral" else None
    print("flashinfer:", fi, flush=True)
    (OUT / "rules_check.json").write_text(json.dumps({"equal": rows, "flashinfer": fi,
                                                      "deferral": deferral}, indent=2))
    print("\n| model | rules | rel L2 vs CPU reference | greedy equal to cpu.yaml | "
          "same, batch 1 (int16 x) | step graph == layer graphs == eager | "
          "fast: step == layers | Triton variants compiled after start-up |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['rules']} | {r['rel_l2']:.2e} | {r['greedy_equal']} | "
              f"{r['batch1_greedy_equal']} | {r['graphs_equal_eager']} | "
              f"{r['fast_step_equal_layers']} | {r['compiled_after_start'] or 'none'} |")
    if deferral:
        print("\n| model | rules | greedy equal to cpu.yaml's, deferred (exact experts) | "
              "step graph == layer graphs == eager | fast: step == layers == eager | "
              "tokens unlike undeferred |")
        print("|---|---|---|---|---|---|")
        for r in deferral:
            print(f"| {r['model']} | {r['rules']} | {r['greedy_equal_cpu']} | "
                  f"{r['graphs_equal_eager']} | {r['fast_step_equal_layers']} | "
                  f"{r['differs_from_exact']} |")


if __name__ == "__main__":
    main()
