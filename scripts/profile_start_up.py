"""Where a start of `hybrid serve` goes, phase by phase: each start-up line `hybrid serve`
prints, with the seconds until the next one and, inside them, the seconds this process spent
compiling Triton kernels (and how many) and compiling or loading numba functions (outermost
calls only; the background compile processes are not counted, the wait for them is its own
phase). Run on a fresh machine (or with fresh TRITON_CACHE_DIR and NUMBA_CACHE_DIR) for a
first start.

    python scripts/profile_start_up.py --gguf-path M.gguf [--optimize-rules R] [--set k=v]
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import threading
import time
from collections import defaultdict


class Ledger:
    """Seconds and counts per phase; a phase starts at each start-up line."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.phases: list[dict] = []
        self.lock = threading.Lock()
        self.open: dict[tuple, float] = {}  # (thread, kernel, key) -> start
        self.numba_depth: dict[int, int] = defaultdict(int)
        self.numba_start: dict[int, float] = {}
        self.kernels: dict[str, float] = defaultdict(float)  # Triton kernel -> compile s
        self.events: list[str] = []  # the plan, the background compile processes
        self.begin("process start")

    def begin(self, line: str) -> None:
        with self.lock:
            self.phases.append({"line": line, "at": time.monotonic() - self.t0,
                                "triton_n": 0, "triton_s": 0.0, "numba_s": 0.0})

    def triton_start(self, key: tuple) -> None:
        with self.lock:
            self.open[key] = time.monotonic()

    def triton_end(self, key: tuple, name: str) -> None:
        with self.lock:
            start = self.open.pop(key, None)
            if start is not None:
                spent = time.monotonic() - start
                self.phases[-1]["triton_n"] += 1
                self.phases[-1]["triton_s"] += spent
                self.kernels[name] += spent

    def numba(self, starting: bool) -> None:
        me = threading.get_ident()
        with self.lock:
            if starting:
                self.numba_depth[me] += 1
                if self.numba_depth[me] == 1:
                    self.numba_start[me] = time.monotonic()
            else:
                self.numba_depth[me] -= 1
                if self.numba_depth[me] == 0:
                    self.phases[-1]["numba_s"] += time.monotonic() - self.numba_start.pop(me)

    def event(self, what: str) -> None:
        with self.lock:
            self.events.append(f"{time.monotonic() - self.t0:.1f} s: {what}")

    def table(self) -> str:
        end = time.monotonic() - self.t0
        rows = ["| at s | phase | s | Triton compiles | Triton s | numba s |",
                "|---|---|---|---|---|---|"]
        for i, p in enumerate(self.phases):
            until = self.phases[i + 1]["at"] if i + 1 < len(self.phases) else end
            rows.append(f"| {p['at']:.1f} | {p['line'][:70]} | {until - p['at']:.1f} | "
                        f"{p['triton_n']} | {p['triton_s']:.1f} | {p['numba_s']:.1f} |")
        return "\n".join(rows)


def install(ledger: Ledger) -> None:
    """Triton's compile hooks and numba's compile events report into `ledger`."""
    from numba.core import event

    class NumbaTimes(event.Listener):
        def on_start(self, ev) -> None:
            ledger.numba(True)

        def on_end(self, ev) -> None:
            ledger.numba(False)

    event.register("numba:compile", NumbaTimes())  # for the whole process
    watch_background_compiles(ledger)
    try:
        import triton
    except ImportError:
        return

    def key_of(kw) -> tuple:
        return (threading.get_ident(), str(kw.get("repr")), str((kw.get("compile") or {}).get("key")))

    def before(**kw):
        ledger.triton_start(key_of(kw))
        return False  # compile it

    def after(**kw):
        ledger.triton_end(key_of(kw), str(kw.get("repr")))

    triton.knobs.runtime.jit_cache_hook = before
    triton.knobs.runtime.jit_post_compile_hook = after


def watch_background_compiles(ledger: Ledger) -> None:
    """When each of cpu_kernels' background compile processes starts and exits, and when the
    plan is made."""
    from cpu_kernels.runtime.precompile import BackgroundProcesses

    def watched(cls) -> None:
        started = cls.__init__

        def init(self, *args, **kwargs) -> None:
            started(self, *args, **kwargs)
            for p in self.procs:
                what = " ".join(p.args[3:])
                ledger.event(f"background compile started: {what}")

                def watch(p=p, what=what) -> None:
                    p.wait()
                    ledger.event(f"background compile exited {p.returncode}: {what}")
                threading.Thread(target=watch, daemon=True).start()

        cls.__init__ = init

    watched(BackgroundProcesses)  # the MoE kernels' and the packers' processes
    from hybrid.rules import load

    planned = load.plan_model

    def plan_model(*args, **kwargs):
        ledger.event("making the plan")
        out = planned(*args, **kwargs)
        ledger.event("plan made")
        return out

    load.plan_model = plan_model  # load_with_rules calls it by this module's name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", required=True)
    ap.add_argument("--optimize-rules", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ledger = Ledger()
    install(ledger)
    from server import serve
    from server.config import ServerConfig

    said = serve._status_line

    def status(message: str) -> None:
        said(message)
        ledger.begin(message)

    serve._status_line = status  # build_state reports its phases through it
    settings = {"gguf_path": args.gguf_path, "optimize_rules": args.optimize_rules,
                "log_level": "warning"}
    for item in args.set:
        name, _, value = item.partition("=")
        settings[name] = ast.literal_eval(value)
    state = serve.build_state(ServerConfig.from_flat(settings), start=False)
    ledger.begin("(built)")
    top = sorted(ledger.kernels.items(), key=lambda kv: -kv[1])[:15]
    print("\nTriton compile seconds by kernel: "
          + ", ".join(f"{k} {s:.1f}" for k, s in top), file=sys.stderr)
    print(ledger.table(), file=sys.stderr)
    print("\n".join(ledger.events), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"phases": ledger.phases, "kernels": ledger.kernels,
                       "events": ledger.events}, f, indent=1)
    state.worker.shutdown() if hasattr(state.worker, "shutdown") else None


if __name__ == "__main__":
    main()
