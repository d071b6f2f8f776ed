"""The code's layers, checked from the source: no import circle between files, and no import
that runs up a layer. Imports are read with `ast` (module level and inside functions alike;
`if TYPE_CHECKING:` blocks are annotations, not imports, and are skipped)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ggml_types", "cpu_kernels", "gpu_kernels", "hybrid", "server", "cli")
# top-level packages, lowest first: each imports only from those before it (and itself)
TOP = {"ggml_types": 0, "cpu_kernels": 1, "gpu_kernels": 1, "hybrid": 2, "server": 3, "cli": 4}
# hybrid's own sub-packages and modules, lowest first (the loader below the rules, ...)
HYBRID = {"errors": 0, "env": 0, "settings": 1, "gguf": 1, "tokenizer": 2, "model": 3,
          "synth": 4, "ops": 4, "demo": 5, "rules": 5, "engine": 6, "tuning": 7}
# hybrid.engine's parts, lowest first: the scheduler's bookkeeping below the step, the step's
# forward below what runs it (its graphs, long prompts), the runner above those, the engine's
# loop and its front doors last
# cpu_kernels' parts, lowest first: block formats, the instructions kernels are built from, the
# exact kernels (whose block readers the packed ones reuse), the packed fast ones, AMX's, the
# MoE entry choosing among them, and the pool that runs it
CPU = {"cache_lock": 0, "formats": 1, "simd": 2, "exact": 3, "fast": 4, "amx": 5, "moe": 6,
       "runtime": 7}
ENGINE = {"config": 0, "heap": 0, "step_trace": 0, "device_values": 0, "sampling": 1,
          "scheduling": 2, "outputs": 3, "attention": 3, "step": 3, "graphs": 4, "prefill": 4,
          "runner": 5, "launch_ahead": 5, "worker": 6, "engine": 6, "llm": 7}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and getattr(node.test, "id", "") == "TYPE_CHECKING"
                for body in node.body for n in ast.walk(body)}
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                found.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                found.update(resolve(f"{base}.{a.name}") or resolve(base) for a in node.names)
        edges[mod] = {t for t in found if t and t != mod}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root, targets in edges.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


EDGES = _imports(_modules())


def test_no_import_circle_between_files() -> None:
    assert _cycles(EDGES) == []


def test_no_import_runs_up_a_layer() -> None:
    up = []
    for mod, targets in EDGES.items():
        top = mod.split(".")[0]
        for t in targets:
            t_top = t.split(".")[0]
            if TOP[t_top] > TOP[top] or (TOP[t_top] == TOP[top] and t_top != top):
                up.append(f"{mod} -> {t}")
            elif top == t_top == "hybrid" and "." in mod and "." in t:
                a, b = mod.split(".")[1], t.split(".")[1]
                if a != b and HYBRID[b] >= HYBRID[a]:
                    up.append(f"{mod} -> {t}")
                elif a == b == "engine" and mod.count(".") > 1 and t.count(".") > 1:
                    a, b = mod.split(".")[2], t.split(".")[2]
                    if a != b and ENGINE[b] >= ENGINE[a]:
                        up.append(f"{mod} -> {t}")
            elif top == t_top == "cpu_kernels" and "." in mod and "." in t:
                a, b = mod.split(".")[1], t.split(".")[1]
                if a != b and CPU[b] >= CPU[a]:
                    up.append(f"{mod} -> {t}")
    assert up == []


def test_the_check_sees_circles_and_every_package() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert {m.split(".")[0] for m in EDGES} == set(PACKAGES)
    assert {m.split(".")[1] for m in EDGES if m.startswith("hybrid.")} <= set(HYBRID)
    assert {m.split(".")[2] for m in EDGES if m.startswith("hybrid.engine.")} == set(ENGINE)
    assert {m.split(".")[1] for m in EDGES if m.startswith("cpu_kernels.")} == set(CPU)
    # imports inside functions count too
    assert "hybrid.engine.graphs.choice" in EDGES["hybrid.engine.graphs.setup"]


def test_the_served_engine_imports_no_triton_kernel() -> None:
    """The engine and the server import gpu_kernels' Triton kernels only where a step runs them:
    a module-level import would define them before tests/gpu_kernels/conftest.py sets
    TRITON_INTERPRET in the same process (CPU kernels then fail), and costs every CPU start."""
    import subprocess
    import sys

    code = ("import sys, hybrid.engine.engine, hybrid.engine.llm, server.serve; "
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert out.strip() == "[]"
