"""Each defective file gives one clear line naming the problem; none gives a traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from hybrid.gguf.quant_types import Q

from .gguf_edit import rewrite, set_tensor_type


def run_cli(capsys, path: Path) -> str:
    code = main(["generate", "--gguf-path", str(path), "--prompt", "hi", "--max-new-tokens", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    lines = [line for line in err if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def good(models, tmp_path: Path) -> Path:
    dst = tmp_path / "model.gguf"
    shutil.copy(models.path("tiny-v3", "q4_k_m"), dst)
    return dst


def test_non_deepseek_architecture(capsys, good: Path, tmp_path: Path) -> None:
    bad = rewrite(good, tmp_path / "llama.gguf", arch="llama")
    assert "architecture 'llama' is not a DeepSeek model" in run_cli(capsys, bad)


def test_truncated_data(capsys, good: Path) -> None:
    size = good.stat().st_size
    with open(good, "r+b") as f:
        f.truncate(size // 2)
    line = run_cli(capsys, good)
    assert "file is truncated: tensor" in line and "download it again" in line


def test_truncated_header(capsys, good: Path) -> None:
    with open(good, "r+b") as f:
        f.truncate(4096)
    assert "the header is truncated" in run_cli(capsys, good)


def test_not_a_gguf(capsys, tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    assert "not a GGUF file (bad magic" in run_cli(capsys, path)


def test_missing_split_part(capsys, models, tmp_path: Path) -> None:
    for f in models.files("tiny-v3", "q4_k_m", split=3):
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "tiny-v3-q4_k_m-legacy-00002-of-00003.gguf").unlink()
    line = run_cli(capsys, tmp_path / "tiny-v3-q4_k_m-legacy-00001-of-00003.gguf")
    assert "split part(s) tiny-v3-q4_k_m-legacy-00002-of-00003.gguf missing" in line


def test_shapes_contradict_metadata(capsys, good: Path, tmp_path: Path) -> None:
    bad = rewrite(good, tmp_path / "heads.gguf", {"deepseek2.attention.head_count": 8})
    line = run_cli(capsys, bad)
    assert "tensor blk.0.attn_q_b.weight has shape" in line and "metadata implies" in line


def test_missing_metadata_key(capsys, good: Path, tmp_path: Path) -> None:
    bad = rewrite(good, tmp_path / "nokey.gguf")
    data = bad.read_bytes().replace(b"deepseek2.expert_count", b"deepseek2.expert_cnt__")
    bad.write_bytes(data)
    assert "metadata key deepseek2.expert_count is missing" in run_cli(capsys, bad)


def test_unsupported_known_type(capsys, good: Path) -> None:
    # Q4_K (144 B) -> TQ1_0 (54 B) changes the size: the check names type, not truncation.
    set_tensor_type(good, "blk.1.ffn_gate_exps.weight", Q.TQ1_0)
    line = run_cli(capsys, good)
    assert "tensor blk.1.ffn_gate_exps.weight has type TQ1_0, which hybrid cannot read" in line
    assert "llama-quantize --allow-requantize" in line
    assert "supported types: F32, F16, BF16, Q8_0" in line


def test_unknown_type_id(capsys, good: Path) -> None:
    set_tensor_type(good, "blk.1.ffn_up_exps.weight", 142)  # an ik_llama.cpp-only type
    line = run_cli(capsys, good)
    assert "tensor blk.1.ffn_up_exps.weight has type unknown type id 142" in line


def test_missing_path_and_empty_folder(capsys, tmp_path: Path) -> None:
    assert "no such file or folder" in run_cli(capsys, tmp_path / "nope.gguf")
    assert "the folder holds no .gguf file" in run_cli(capsys, tmp_path)


def test_no_traceback_from_a_real_process(good: Path) -> None:
    with open(good, "r+b") as f:
        f.truncate(1000)
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "generate", "--gguf-path", str(good), "--prompt", "x"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
