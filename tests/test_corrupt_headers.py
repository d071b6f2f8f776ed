"""A GGUF header with flipped bytes or blown-up lengths fails with one short readable line.

Every length and count is bounded before anything is read or allocated, and names reach the
message escaped and cut short: never kilobytes of binary, never a traceback.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from hybrid.errors import GGUFError, shown
from hybrid.gguf.header import read_header
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import read_spec


@pytest.fixture
def good(models, tmp_path: Path) -> Path:
    dst = tmp_path / "model.gguf"
    shutil.copy(models.path("tiny-v3", "q4_k_m"), dst)
    return dst


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _name_offset(path: Path, name: bytes) -> int:
    """Byte offset of the uint64 length in front of the string `name` in the header."""
    head = path.read_bytes()[: 1 << 20]
    at = head.index(struct.pack("<Q", len(name)) + name)
    return at


def _error(path: Path) -> str:
    with pytest.raises(GGUFError) as e:
        read_spec(GGUFModelFile(path))
    return str(e.value)


def _readable(line: str) -> None:
    assert "\n" not in line and line.isprintable() and len(line) < 400, line


def test_shown_escapes_and_cuts() -> None:
    assert shown("blk.0.attn_q_b.weight") == "blk.0.attn_q_b.weight"
    assert shown(b"ab\x00\xff\n") == "ab\\x00\\xff\\n"
    long = shown(b"\x01" * 5000, limit=16)
    assert long.endswith("(5000 characters)") and len(long) < 48


def test_blown_up_tensor_count(good: Path) -> None:
    _patch(good, 8, struct.pack("<Q", 1 << 40))
    line = _error(good)
    _readable(line)
    assert "the tensor count at header byte 8 is 1099511627776" in line
    assert "truncated or corrupt" in line


def test_blown_up_array_length(good: Path) -> None:
    at = _name_offset(good, b"tokenizer.ggml.tokens") + 8 + len(b"tokenizer.ggml.tokens")
    _patch(good, at + 4 + 4, struct.pack("<Q", 1 << 50))  # value type, element type, count
    line = _error(good)
    _readable(line)
    assert "an array's length" in line


def test_tensor_name_length_read_from_binary(good: Path) -> None:
    at = _name_offset(good, b"token_embd.weight")
    _patch(good, at, struct.pack("<Q", 5000))
    line = _error(good)
    _readable(line)
    assert "the name of tensor #" in line and "5000 bytes long (the format allows at most 64)" in line


def test_binary_tensor_name(good: Path) -> None:
    at = _name_offset(good, b"token_embd.weight")
    _patch(good, at + 8, b"\x00\x9f\x1b[2J")
    line = _error(good)
    _readable(line)
    assert "\\x00\\x9f\\x1b[2J" in line and "is not printable text" in line


def test_binary_metadata_key(good: Path) -> None:
    at = _name_offset(good, b"general.architecture")
    _patch(good, at + 8, b"\x07\x08")
    line = _error(good)
    _readable(line)
    assert "metadata key #" in line and "\\x07\\x08neral.architecture" in line


def test_too_many_dimensions(good: Path) -> None:
    name = b"token_embd.weight"
    at = _name_offset(good, name) + 8 + len(name)
    _patch(good, at, struct.pack("<I", 7))
    line = _error(good)
    assert "tensor token_embd.weight has 7 dimensions (at most 4)" in line


def test_binary_architecture_value(good: Path) -> None:
    at = _name_offset(good, b"general.architecture") + 8 + len(b"general.architecture")
    _patch(good, at + 4 + 8, b"\x1b\x00")  # value type, string length, then the value's bytes
    line = _error(good)
    _readable(line)
    assert "architecture '\\x1b\\x00epseek2' is not a DeepSeek model" in line


def test_cli_prints_one_short_line(capsys, good: Path) -> None:
    _patch(good, _name_offset(good, b"token_embd.weight"), struct.pack("<Q", 1 << 33))
    code = main(["generate", "--gguf-path", str(good), "--prompt", "hi", "--max-new-tokens", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:")
    _readable(err[0])


def test_random_flips_never_escape_as_anything_but_one_line(good: Path) -> None:
    """Fuzz: flips anywhere in the header either still parse or give a readable GGUFError."""
    original = good.read_bytes()
    end = read_header(good).data_start
    rng = np.random.default_rng(0)
    failures = 0
    for _ in range(300):
        data = bytearray(original[:end])
        for at in rng.integers(0, end, 4):
            data[at] ^= 1 << int(rng.integers(0, 8))
        good.write_bytes(bytes(data) + original[end:])
        try:
            read_header(good)
        except GGUFError as e:
            failures += 1
            _readable(str(e))
    assert failures > 0
