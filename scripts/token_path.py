"""Which of the project's files and lines one request passes through, from its HTTP request to
its sampled tokens, with `hybrid serve`'s defaults: what a newcomer following a token reads.

    python scripts/token_path.py [--gguf-path FILE] [--optimize-rules NAME] [--tokens 4]
        [--json OUT] [--functions]

It starts the served app in this process (server/inprocess.py: the app and uvicorn of `hybrid
serve`) with the engine's defaults, sends one streamed chat completion to warm every path,
then records a second one with a profile hook on every Python thread the server runs (the
event loop, the engine worker): each function of ggml_types/, cpu_kernels/, gpu_kernels/,
hybrid/, server/ or cli/ that runs. It prints the files (with their lines) and the lines of the
functions that ran, by package, and the totals.

Kernels compiled by numba or Triton run no Python: the file of their wrapper is counted (each
kernel sits beside the wrapper that launches it or in a module it imports), not the jitted
helpers they call. On a GPU machine this is the default GPU layout (attention on CUDA, CPU
experts, decode CUDA graphs); on a CPU machine the CPU layout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ggml_types", "cpu_kernels", "gpu_kernels", "hybrid", "server", "cli")


class Recorder:
    """A profile hook (sys.setprofile's) that keeps the code objects of the project it sees
    called while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.codes: set = set()
        self._roots = tuple(str(ROOT / p) + "/" for p in PACKAGES)

    def __call__(self, frame, event, arg):
        if self.on and event == "call":
            code = frame.f_code
            if code not in self.codes and code.co_filename.startswith(self._roots):
                self.codes.add(code)

    def report(self) -> dict:
        files: dict[str, set] = defaultdict(set)
        for code in self.codes:
            lines = [line for _, _, line in code.co_lines() if line is not None]
            span = range(code.co_firstlineno, max(lines, default=code.co_firstlineno) + 1)
            files[str(Path(code.co_filename).relative_to(ROOT))].update(span)
        rows = {}
        for name, ran in sorted(files.items()):
            total = len((ROOT / name).read_text().splitlines())
            rows[name] = {"file_lines": total, "function_lines": len(ran),
                          "functions": sorted(c.co_qualname for c in self.codes
                                              if c.co_filename == str(ROOT / name))}
        return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-path", default=None, help="default: the demo model")
    ap.add_argument("--optimize-rules", default=None, help="default: the bundled rules")
    ap.add_argument("--tokens", type=int, default=4, help="tokens the recorded request makes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--functions", action="store_true",
                    help="also name each file's functions that ran")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import httpx

    from server.config import ServerConfig
    from server.inprocess import InProcessServer
    from server.serve import build_state

    config = ServerConfig.from_flat({"gguf_path": args.gguf_path,
                                     "optimize_rules": args.optimize_rules})
    state = build_state(config, start=False)
    recorder = Recorder()
    # on every thread started from here: the engine worker, uvicorn's
    threading.setprofile(recorder)
    state.worker.start()
    server = InProcessServer(state)
    body = {"model": state.model.name, "stream": True, "max_tokens": args.tokens,
            "temperature": 0, "messages": [{"role": "user", "content": "Follow this token."}]}
    try:
        with httpx.Client(timeout=600) as client:
            for record in (False, True):  # the first warms every path
                recorder.on = record
                with client.stream("POST", f"{server.url}/v1/chat/completions",
                                   json=body) as r:
                    r.raise_for_status()
                    chunks = [line for line in r.iter_lines() if line.startswith("data:")]
                recorder.on = False
    finally:
        threading.setprofile(None)
        server.stop()
    rows = recorder.report()
    by_package: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for name, row in rows.items():
        top = name.split("/")[0] if not name.startswith("hybrid/") else "/".join(
            name.split("/")[:2])
        acc = by_package[top]
        acc[0] += 1
        acc[1] += row["file_lines"]
        acc[2] += row["function_lines"]
    totals = [len(rows), sum(r["file_lines"] for r in rows.values()),
              sum(r["function_lines"] for r in rows.values())]
    if args.json:
        Path(args.json).write_text(json.dumps({"files": rows, "totals": totals,
                                               "sse_chunks": len(chunks)}, indent=2))
    for name, row in rows.items():
        print(f"{row['file_lines']:6} {row['function_lines']:6}  {name}")
        if args.functions:
            print("               " + ", ".join(row["functions"]))
    print("\n| part | files | their lines | lines of the functions that ran |\n|---|---|---|---|")
    for top, (n, lines, ran) in sorted(by_package.items()):
        print(f"| {top} | {n} | {lines} | {ran} |")
    print(f"| **all** | **{totals[0]}** | **{totals[1]}** | **{totals[2]}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
