"""One engine, the beside thread gated on the CPU experts' region start (HostExperts.
wait_driving, the default) against not gated, alternating: what the gate does to a decode step.

    python scripts/probe_beside_gate.py [--gguf-path P] [--optimize-rules R] [--defer 0,3]
        [--rounds 3] [--gen-len 256]

Each round runs probe_decode_host's request once gated and once not, at each k of --defer
(defer_experts on every CPU experts layer); medians over the rounds of the probe's phases, and
the CPU experts' busy time of the first four MoE layers (those that run beside the beside
thread's draw, schedule and launch) against the rest. Needs a whole-step graph (a GPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import probe_decode_host as probe_host

from hybrid.engine.llm import LLM
from hybrid.ops.experts import set_deferral

PHASES = ("gpu_to_first_layer", "cpu_experts", "cpu_waits_between_layers", "period")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None)
    ap.add_argument("--optimize-rules", default=None)
    ap.add_argument("--defer", default="0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-len", type=int, default=256)
    args = ap.parse_args()
    request = argparse.Namespace(prompt_len=32, gen_len=args.gen_len, temperature=0.0,
                                 top_p=1.0)
    llm = LLM(args.gguf_path, args.optimize_rules)
    stamps = probe_host.Stamps()
    host = probe_host.instrument(llm, stamps)
    if host is None:
        print("no whole-step graph here (a GPU is needed): nothing to gate")
        return 1
    gated = host.wait_driving
    runs: dict[tuple[int, bool], list[dict]] = {}
    for k in (int(x) for x in args.defer.split(",")):
        set_deferral(llm.engine.runner.model, k)
        for r in range(args.rounds):
            for gate in (True, False):
                host.wait_driving = gated if gate else (lambda: None)  # this instance only
                runs.setdefault((k, gate), []).append(
                    probe_host.probe(llm, stamps, host, request, f"k{k}-{gate}-{r}", 0))
    print(f"| k | gated | {' | '.join(PHASES)} | tok/s (rounds) | busy, first 4 layers | "
          f"busy, the rest |\n|---|---|{'---|' * (len(PHASES) + 3)}")
    for (k, gate), rounds in runs.items():
        med = {p: statistics.median(r["medians_us"][p] for r in rounds) for p in PHASES}
        first = statistics.median(sum(x["busy"] for x in r["layers_us"][:4]) for r in rounds)
        rest = statistics.median(sum(x["busy"] for x in r["layers_us"][4:]) for r in rounds)
        rates = " / ".join(f"{1e6 / r['medians_us']['period']:.1f}" for r in rounds)
        print(f"| {k} | {gate} | {' | '.join(f'{med[p]:.0f}' for p in PHASES)} | "
              f"{1e6 / med['period']:.1f} ({rates}) | {first:.0f} | {rest:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
