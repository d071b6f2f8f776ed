"""Make broken GGUF files on purpose, by rewriting a good one (test helper)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def rewrite(src: Path, dst: Path, metadata: dict[str, Any] | None = None,
            arch: str | None = None) -> Path:
    """Copy `src` to `dst` with some metadata values replaced (same value types)."""
    reader = GGUFReader(src)
    old_arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch or old_arch)
    overrides = metadata or {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = overrides.get(name, field.contents())
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def set_tensor_type(path: Path, tensor: str, type_id: int) -> None:
    """Overwrite the type id in `tensor`'s header entry, in place."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.find(struct.pack("<Q", len(name)) + name)
    assert at >= 0, tensor
    pos = at + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, pos)
    pos += 4 + 8 * n_dims
    struct.pack_into("<I", data, pos, type_id)
    path.write_bytes(bytes(data))


def vocab_only(src: Path, dst: Path, metadata: dict[str, str]) -> Path:
    """`src`'s metadata alone (no tensors: enough for llama.cpp's vocab_only load), with the
    string values in `metadata` replaced; fast, as it copies the other entries' bytes."""
    from hybrid.gguf.header import _Cursor

    buf = src.read_bytes()
    cur = _Cursor(buf, src)
    cur.scalar("<I"), cur.scalar("<I"), cur.scalar("<Q")
    num_kv = cur.scalar("<Q")
    out = bytearray(buf[:8] + struct.pack("<QQ", 0, num_kv))
    for _ in range(num_kv):
        start = cur.pos
        key = cur.string()
        cur.value(cur.scalar("<I"))
        if key in metadata:
            k, v = key.encode(), metadata[key].encode()
            out += struct.pack("<Q", len(k)) + k + struct.pack("<IQ", GGUFValueType.STRING, len(v)) + v
        else:
            out += buf[start:cur.pos]
    out += bytes(-len(out) % 32)
    dst.write_bytes(bytes(out))
    return dst
