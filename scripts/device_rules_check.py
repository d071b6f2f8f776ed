"""GPU machine check of the rules path: real CUDA placements equal the CPU reference, and a
first baseline of decode speed on a V2-Lite-shaped Q4_K_M model.

Run on the GPU machine (see scripts/device_rules_check.sh). Writes $OUT/rules_check.json and
prints a short table last.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybrid.engine.llm import LLM
from hybrid.engine.sampling_params import SamplingParams
from hybrid.model.loader import load_model
from hybrid.rules.engine import plan_model
from hybrid.rules.inject import inject
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


def check_equal(path: str, rules: str) -> dict:
    ref = load_model(path).model
    model = inject(plan_model(path, rules, announce=False))
    devices = sorted({str(t.device) for m in model.modules() for t in vars(m).values()
                      if isinstance(t, torch.Tensor)})
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        err = rel_l2(model(input_ids=ids).logits[0].cpu(), ref(input_ids=ids).logits[0])
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    gpu = LLM(path, rules).generate(prompt_token_ids=[PROMPT], sampling_params=params)
    cpu = LLM(path, "cpu").generate(prompt_token_ids=[PROMPT], sampling_params=params)
    same = gpu[0].outputs[0].token_ids == cpu[0].outputs[0].token_ids
    return {"model": Path(path).name, "rules": rules, "rel_l2": err, "greedy_equal": same,
            "devices": devices}


def decode_speed(path: str, rules: str, prompt_len: int = 128, gen: int = 32) -> dict:
    t = time.perf_counter()
    llm = LLM(path, rules)
    load_s = time.perf_counter() - t
    ids = [0] + list(range(1000, 1000 + prompt_len - 1))
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    list(llm.stream(ids[:8], SamplingParams(temperature=0, max_tokens=2)))  # warm-up (JIT)
    stamps = []
    t0 = time.perf_counter()
    for _ in llm.stream(ids, params):
        stamps.append(time.perf_counter())
    ttft = stamps[0] - t0
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    return {"model": Path(path).name, "rules": rules, "load_s": load_s, "prefill_tokens": prompt_len,
            "ttft_s": ttft, "decode_tok_s": decode}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for preset, quant, layout, rules in (("tiny-v3", "q4_k_m", "legacy", "DeepSeek-V3"),
                                         ("tiny-v3", "q4_k_m", "mla", "DeepSeek-V3-gpu-experts"),
                                         ("tiny-v2-lite", "q4_k_m", "mla", "DeepSeek-V2-Lite")):
        rows.append(check_equal(build(preset, quant, layout), rules))
        print(rows[-1], flush=True)
    speed = []
    v2 = build("v2-lite", "q4_k_m", "legacy", vocab="deepseek")
    for rules in ("DeepSeek-V2-Lite", "cpu"):
        speed.append(decode_speed(v2, rules))
        print(speed[-1], flush=True)
    (OUT / "rules_check.json").write_text(json.dumps({"equal": rows, "speed": speed}, indent=2))
    print("\n| model | rules | rel L2 vs CPU reference | greedy equal |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['rules']} | {r['rel_l2']:.2e} | {r['greedy_equal']} |")
    print("\n| model | rules | load s | TTFT s (128 tok) | decode tok/s |")
    print("|---|---|---|---|---|")
    for s in speed:
        print(f"| {s['model']} | {s['rules']} | {s['load_s']:.1f} | {s['ttft_s']:.2f} | "
              f"{s['decode_tok_s']:.2f} |")


if __name__ == "__main__":
    main()
