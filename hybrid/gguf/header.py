"""Parse one GGUF file's header: metadata key/values and tensor infos.

We parse the header ourselves (with gguf-py's constants) rather than through `gguf.GGUFReader`
so that every defect becomes a one-line `GGUFError` naming the file and the tensor: the reader
gives up with a bare ValueError on tensor types it does not know (IQ*_K types of ik_llama.cpp,
say) and on truncation. Only the header is read; tensor data stays on disk until memory-mapped.

A corrupt header (flipped bytes, a blown-up length or count) must fail fast and readably: every
length and count is bounded by what the format allows (GGUF spec: keys at most 65535 bytes of
ASCII, tensor names at most 64 bytes, at most 4 dimensions) and by the bytes left in the file
before anything is allocated, and names reach messages only through `shown` (escaped, cut short).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from hybrid.errors import GGUFError, shown

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
MAX_KEY_BYTES = 65535  # GGUF spec: a key is ASCII, at most 2^16 - 1 bytes
MAX_NAME_BYTES = 64  # ggml's GGML_MAX_NAME
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# fewest bytes one entry can take: a key/value (key length, type, a 1-byte value), a tensor info
# (name length, dims, type, offset with no dimensions), an array element of each type
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_MIN_STRING_BYTES = 8
_MIN_ARRAY_BYTES = 4 + 8


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

    def corrupt(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what} (header byte {self.pos}); the file is corrupt, "
                         "download it again")

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str, min_bytes: int) -> int:
        """A uint64 count of entries of at least `min_bytes` each, bounded by the bytes left."""
        n = self.scalar("<Q")
        left = len(self.buf) - self.pos
        if n * min_bytes > left:
            raise GGUFError(f"{self.path}: {what} at header byte {self.pos - 8} is {n}, more than "
                            f"the {left} bytes left in the file can hold: the header is truncated "
                            "or corrupt; download the file again")
        return n

    def raw_string(self, limit: int, what: str) -> bytes:
        n = self.scalar("<Q")
        if n > limit:
            raise self.corrupt(f"{what} is {n} bytes long (the format allows at most {limit})")
        return self.take(n)

    def string(self) -> str:
        raw = self.take(self.count("a string's length", 1))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def name(self, limit: int, what: str, ascii_only: bool = False) -> str:
        """A key or tensor name: valid, printable (ASCII if asked) and at most `limit` bytes."""
        raw = self.raw_string(limit, what)
        try:
            text = raw.decode("ascii" if ascii_only else "utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or not text.isprintable():
            raise self.corrupt(f"{what} {shown(raw)} is not printable text")
        return text

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            elem_type = self.scalar("<I")
            fmt = _SCALAR_FORMATS.get(elem_type)
            least = struct.calcsize(fmt) if fmt else (
                _MIN_STRING_BYTES if elem_type == GGUFValueType.STRING else _MIN_ARRAY_BYTES)
            count = self.count("an array's length", least)
            if fmt is not None:  # fast path for numeric arrays
                size = struct.calcsize(fmt)
                raw = self.take(size * count)
                return list(struct.unpack(f"<{count}{fmt[1]}", raw))
            return [self.value(elem_type) for _ in range(count)]
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise self.corrupt(f"unknown metadata value type {vtype}")
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
    num_tensors = cur.count("the tensor count", _MIN_TENSOR_INFO_BYTES)
    num_kv = cur.count("the metadata key count", _MIN_KV_BYTES)
    metadata: dict[str, Any] = {}
    for i in range(num_kv):
        key = cur.name(MAX_KEY_BYTES, f"metadata key #{i}", ascii_only=True)
        metadata[key] = cur.value(cur.scalar("<I"))
    raw_infos = []
    seen: set[str] = set()
    for i in range(num_tensors):
        name = cur.name(MAX_NAME_BYTES, f"the name of tensor #{i}")
        if name in seen:
            raise cur.corrupt(f"tensor {name} is listed twice")
        seen.add(name)
        n_dims = cur.scalar("<I")
        if n_dims > MAX_DIMS:
            raise cur.corrupt(f"tensor {name} has {n_dims} dimensions (at most {MAX_DIMS})")
        ne = [cur.scalar("<Q") for _ in range(n_dims)]
        qtype = cur.scalar("<I")
        offset = cur.scalar("<Q")
        raw_infos.append((name, qtype, tuple(reversed(ne)), offset, ne))
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.corrupt(f"general.alignment is {shown(alignment)}, not a power of two")
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, qtype, shape, offset, ne in raw_infos:
        nbytes = -1
        if offset % alignment:
            raise GGUFError(f"{path}: tensor {name}'s data offset {offset} is not a multiple of "
                            f"the alignment {alignment}; the file is corrupt, download it again")
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
