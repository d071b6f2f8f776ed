"""GPU kernel tests: on a CUDA device where there is one, else in Triton's interpreter on the CPU
(TRITON_INTERPRET=1, set before any kernel module is imported). Without triton they skip."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# Triton's interpreter pays per program and per op, not per byte: the decode tiles a GPU runs
# (1-8 rows a program) took 26 s for one 4096 x 256 Q4_K product here, the integer one-token
# tile 54 s; one program of 1024 rows x 1024 weights 0.3-0.8 s.
WIDE_TILES = (1024, 1024, 1, 1)  # rows per program, weights per K step, warps, stages
WIDE_I8_TILES = (1024, 4, 1)  # rows per program, 64-chunks per K step, warps


@pytest.fixture
def wide_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every quantized product in few wide programs when the kernels run in the interpreter:
    for tests of what calls the kernels (the kernels' own tests keep the tiles a GPU runs)."""
    if torch.cuda.is_available():
        return
    from gpu_kernels import moe_grouped, qdot_i8, qmatmul

    monkeypatch.setattr(qmatmul, "DECODE_TILES", {None: WIDE_TILES})
    monkeypatch.setattr(qmatmul, "TOKEN_TILES", {})
    monkeypatch.setattr(qmatmul, "SHORT_ROW_TILES", {})
    monkeypatch.setattr(qmatmul, "DOT_TILES", WIDE_TILES)
    monkeypatch.setattr(moe_grouped, "DOT_TILES", WIDE_TILES)
    monkeypatch.setattr(qdot_i8, "LONG_TILES", WIDE_I8_TILES)
    monkeypatch.setattr(qdot_i8, "SHORT_TILES", WIDE_I8_TILES)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
