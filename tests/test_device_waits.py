"""The engine's launches may not wait for the device (a step launched ahead sits on the stream,
waiting for CPU experts that only the engine's threads drive: engine.py's invariant). One way
to wait that reads like a launch is checked here from the source; the launches themselves are
timed behind a busy CUDA stream in test_overlap_decode.py."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "hybrid" / "engine"


def _number_item_sets(source: str) -> list[str]:
    """`x[...] = <number or bool>` statements (keys that are strings, a dict's, aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign):
            continue
        value = node.value.operand if isinstance(node.value, ast.UnaryOp) else node.value
        if not (isinstance(value, ast.Constant) and isinstance(value.value, (bool, int, float))):
            continue
        for target in node.targets:
            key = target.slice if isinstance(target, ast.Subscript) else None
            if key is not None and not (isinstance(key, ast.Constant)
                                        and isinstance(key.value, str)):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_tensor_item_is_set_to_a_python_number() -> None:
    """`t[ids] = True` on a CUDA tensor copies the number from the host by a copy that waits
    for the stream (it made every penalized sampled draw wait for the step launched ahead);
    index_fill_ / masked_fill_ take it as an argument. The engine writes no item so."""
    found = {str(p.relative_to(ENGINE)): hits for p in sorted(ENGINE.rglob("*.py"))
             if (hits := _number_item_sets(p.read_text()))}
    assert found == {}


def test_the_check_sees_such_a_statement() -> None:
    assert _number_item_sets("seen[ids] = True\nx[0] = -1.5\nd['k'] = False\ny[i] = z\n") == [
        "line 1: seen[ids] = True", "line 2: x[0] = -1.5"]
