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


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
