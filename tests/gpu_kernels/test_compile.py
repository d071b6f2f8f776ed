"""Every kernel variant the engine launches compiles for sm_90 (H100/H200), here too: the
interpreter runs the kernels' arithmetic but not Triton's compiler (gpu_kernels/compile_check.py).
A subprocess, because the interpreter (set for this folder's other tests) replaces the kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_variant_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-m", "gpu_kernels.compile_check", "--arch", "90"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                         check=False)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    lines = [ln for ln in res.stdout.splitlines() if " regs " in ln]
    assert len(lines) >= 100, res.stdout[-2000:]
