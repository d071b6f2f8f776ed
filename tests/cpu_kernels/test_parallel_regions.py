"""Every parallel kernel's serial part (outside its prange loops) calls nothing that numba turns
into a parallel loop of its own (simd/task_queue.py says why: each is one more start and join of
the thread team). Read from the source: the compiled kernels come from numba's cache, which
keeps no parallel diagnostics."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "cpu_kernels"
# numpy calls that numba's parfor passes convert (numba/parfors/parfor.py: ConvertNumpyPass's
# array makers and random draws, ConvertReducePass's reductions)
CONVERTED = {"zeros", "ones", "zeros_like", "ones_like", "full_like", "sum", "prod", "min", "max",
             "amin", "amax", "argmin", "argmax", "mean", "var", "std", "dot"}
CONVERTED_METHODS = {"sum", "prod", "min", "max", "argmin", "argmax", "mean", "var", "std"}


def parallel_kernels() -> list[tuple[str, ast.FunctionDef]]:
    """(file:name, function) of every function decorated njit(parallel=True, ...)."""
    found = []
    for path in sorted(KERNELS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and any(k.arg == "parallel" and isinstance(
                        k.value, ast.Constant) and k.value.value is True for k in d.keywords)
                    for d in node.decorator_list):
                found.append((f"{path.relative_to(KERNELS)}:{node.name}", node))
    return found


def is_prange(loop: ast.stmt) -> bool:
    return isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and getattr(
        loop.iter.func, "id", getattr(loop.iter.func, "attr", None)) == "prange"


def serial_nodes(body: list[ast.stmt]):
    """Every node of `body` outside prange loops' bodies."""
    for stmt in body:
        if is_prange(stmt):
            yield from ast.walk(stmt.iter)
            continue
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.stmt):
                yield from serial_nodes([child])
            else:
                yield from ast.walk(child)
        yield stmt


def converted_calls(fn: ast.FunctionDef) -> list[str]:
    calls = []
    for node in serial_nodes(fn.body):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        numpy = isinstance(owner, ast.Name) and owner.id in ("np", "numpy")
        random = isinstance(owner, ast.Attribute) and owner.attr == "random"
        if (numpy and node.func.attr in CONVERTED) or random or (
                not numpy and node.func.attr in CONVERTED_METHODS):
            calls.append(f"line {node.lineno}: {ast.unparse(node)}")
    return calls


def test_the_scan_finds_the_kernels():
    names = {name for name, _ in parallel_kernels()}
    assert "runtime/region_driver.py:drive_in_one_region" in names
    assert "fast/packed_moe.py:packed_moe_kernel" in names


def test_the_scan_sees_a_serial_zeros_and_not_one_inside_prange():
    fn = ast.parse("def k(n):\n    a = np.zeros(n)\n    for i in prange(n):\n"
                   "        b = np.zeros(3)\n        c = x.sum()\n").body[0]
    assert converted_calls(fn) == ["line 2: np.zeros(n)"]


@pytest.mark.parametrize("name,fn", [pytest.param(n, f, id=n) for n, f in parallel_kernels()])
def test_no_parallel_loop_outside_prange(name, fn):
    assert converted_calls(fn) == [], (
        f"{name}: these become parallel loops of their own (allocate through a non-parallel "
        f"njit function, e.g. simd/task_queue.counters)")
