"""Parse one GGUF file's header: metadata key/values and tensor infos.

We parse the header ourselves (with gguf-py's constants) rather than through `gguf.GGUFReader`
so that every defect becomes a one-line `GGUFError` naming the file and the tensor: the reader
gives up with a bare ValueError on tensor types it does not know (IQ*_K types of ik_llama.cpp,
say) and on truncation. Only the header is read; tensor data stays on disk until memory-mapped.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from hybrid.errors import GGUFError

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's entry in the header. `shape` is numpy order (reversed ggml ne)."""

    name: str
    qtype: int
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int  # -1 when the type is unknown to us


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int
    file_size: int


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise GGUFError(
                f"{self.path}: the header is truncated at byte {self.pos} "
                f"(file is {len(self.buf)} bytes); download the file again"
            )
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        raw = self.take(self.scalar("<Q"))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            elem_type = self.scalar("<I")
            count = self.scalar("<Q")
            fmt = _SCALAR_FORMATS.get(elem_type)
            if fmt is not None:  # fast path for numeric arrays
                size = struct.calcsize(fmt)
                raw = self.take(size * count)
                return list(struct.unpack(f"<{count}{fmt[1]}", raw))
            return [self.value(elem_type) for _ in range(count)]
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise GGUFError(f"{self.path}: unknown metadata value type {vtype}; the file is corrupt")
        return self.scalar(fmt)


def read_header(path: Path) -> GGUFHeader:
    """Parse the header of the GGUF file at `path` (no tensor data is read)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, the mmap outlives nothing
    except OSError as e:
        raise GGUFError(f"{path}: cannot open ({e.strerror})") from None
    with f:
        file_size = path.stat().st_size
        if file_size < 24:
            raise GGUFError(f"{path}: file is {file_size} bytes, too small to be a GGUF file")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _parse(_Cursor(buf, path), path, file_size)
        finally:
            buf.close()


def _parse(cur: _Cursor, path: Path, file_size: int) -> GGUFHeader:
    magic = cur.scalar("<I")
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (bad magic {magic:#010x})")
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    num_tensors = cur.scalar("<Q")
    num_kv = cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(num_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    raw_infos = []
    for _ in range(num_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        if n_dims > 8:
            raise GGUFError(f"{path}: tensor {name} has {n_dims} dimensions; the file is corrupt")
        ne = [cur.scalar("<Q") for _ in range(n_dims)]
        qtype = cur.scalar("<I")
        offset = cur.scalar("<Q")
        raw_infos.append((name, qtype, tuple(reversed(ne)), offset, ne))
    alignment = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, qtype, shape, offset, ne in raw_infos:
        nbytes = -1
        if qtype in GGML_QUANT_SIZES:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if ne and ne[0] % block_size:
                raise GGUFError(
                    f"{path}: tensor {name} has rows of {ne[0]} elements, not a multiple of "
                    f"its type's block of {block_size}; the file is corrupt"
                )
            count = 1
            for n in ne:
                count *= n
            nbytes = count // block_size * type_size
        tensors.append(TensorInfo(name, qtype, shape, data_start + offset, nbytes))
    return GGUFHeader(path, version, metadata, tensors, data_start, file_size)
