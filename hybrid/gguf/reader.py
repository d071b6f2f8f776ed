"""Open a GGUF model as users download it: one file, a split set, or a folder holding either.

Split sets are named like the hub's `Name-00001-of-00003.gguf`; the first part carries the
metadata, every part carries `split.*` keys and some tensors. Tensor data is memory-mapped, so
opening a 377 GB model reads only its headers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import re
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from hybrid.errors import GGUFError
from hybrid.gguf.header import GGUFHeader, TensorInfo, read_header
from hybrid.gguf.quant_types import SUPPORTED_TYPES, supported_names, type_name
from hybrid.gguf.tensor import QuantTensor

_MADV_DONTNEED = 4  # Linux
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def resolve_parts(path: str | Path) -> list[Path]:
    """The files of the model at `path` (a .gguf file, any part of a split set, or a folder)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise GGUFError(f"{path}: no such file or folder; pass --gguf-path a .gguf file or a folder")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".gguf" and p.is_file())
        if not files:
            raise GGUFError(f"{path}: the folder holds no .gguf file")
        stems = {(_SPLIT_RE.match(p.name).group("stem") if _SPLIT_RE.match(p.name) else p.stem) for p in files}
        if len(stems) > 1:
            names = ", ".join(sorted(p.name for p in files))
            raise GGUFError(f"{path}: the folder holds several models ({names}); pass one file")
        path = files[0]
    m = _SPLIT_RE.match(path.name)
    if m is None:
        return [path]
    count = int(m.group("count"))
    parts = [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise GGUFError(
            f"{path.parent}: split part(s) {', '.join(missing)} missing ({count} parts expected); "
            "download every part into the same folder"
        )
    return parts


class GGUFModelFile:
    """All parts of one GGUF model: merged metadata and a name -> tensor map."""

    def __init__(self, path: str | Path) -> None:
        self.parts = resolve_parts(path)
        self.headers: list[GGUFHeader] = [read_header(p) for p in self.parts]
        self._check_split_keys()
        self.tensor_infos: dict[str, tuple[TensorInfo, GGUFHeader]] = {}
        for header in self.headers:
            for info in header.tensors:
                if info.name in self.tensor_infos:
                    raise GGUFError(f"{header.path}: tensor {info.name} appears twice in the model")
                self.tensor_infos[info.name] = (info, header)
        self._check_extents()

    @property
    def path(self) -> Path:
        return self.parts[0]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.headers[0].metadata

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensor_infos

    @property
    def tensor_names(self) -> list[str]:
        return list(self.tensor_infos)

    @property
    def total_bytes(self) -> int:
        return sum(max(info.nbytes, 0) for info, _ in self.tensor_infos.values())

    def tensor(self, name: str) -> QuantTensor:
        """The tensor `name`, memory-mapped; raises GGUFError for unsupported types."""
        if name not in self.tensor_infos:
            raise GGUFError(f"{self.path}: tensor {name} is missing from the model")
        info, header = self.tensor_infos[name]
        if info.qtype not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{header.path.name}: tensor {name} has type {type_name(info.qtype)}, which hybrid "
                f"cannot read (llama.cpp can; `llama-quantize --allow-requantize` turns the file "
                f"into one we read); supported types: {supported_names()}"
            )
        mm = self._memmaps[header.path]
        raw = mm[info.offset : info.offset + info.nbytes]
        if info.qtype in (0, 1, 30):  # F32, F16, BF16: expose elements
            dtype = {0: np.float32, 1: np.float16, 30: np.uint16}[info.qtype]
            raw = raw.view(dtype)
        return QuantTensor(name, info.qtype, info.shape, raw, str(header.path))

    def check_supported_types(self) -> None:
        """Fail on the first tensor whose type we cannot read, before any loading starts."""
        for name, (info, _) in self.tensor_infos.items():
            if info.qtype not in SUPPORTED_TYPES:
                self.tensor(name)

    def release(self, name: str) -> int:
        """Drop tensor `name`'s pages from this process's mapping (madvise MADV_DONTNEED on the
        whole pages inside it): they stay in the page cache, and a later read faults them back,
        so this only lowers the resident size of data no kernel reads any more (the GGUF
        experts once fast mode's packed copy replaced them). Returns the bytes released (0
        where the platform has no madvise)."""
        info, header = self.tensor_infos[name]
        mm = self._memmaps[header.path]
        page = mmap.PAGESIZE
        base = mm.ctypes.data
        start = -(-(base + info.offset) // page) * page
        stop = (base + info.offset + info.nbytes) // page * page
        if stop <= start or _LIBC is None:
            return 0
        _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), _MADV_DONTNEED)
        return stop - start

    @cached_property
    def _memmaps(self) -> dict[Path, np.memmap]:
        return {h.path: np.memmap(h.path, dtype=np.uint8, mode="r") for h in self.headers}

    def _check_split_keys(self) -> None:
        first = self.headers[0].metadata
        declared = first.get("split.count")
        if declared is None:
            if len(self.parts) > 1:
                raise GGUFError(f"{self.path}: named as a split part but has no split.count key")
            return
        if int(declared) != len(self.parts):
            raise GGUFError(
                f"{self.path}: split.count says {declared} parts but {len(self.parts)} were found"
            )
        for i, header in enumerate(self.headers):
            if int(header.metadata.get("split.no", -1)) != i:
                raise GGUFError(f"{header.path}: split.no is not {i}; the parts are mixed up")
        total = sum(len(h.tensors) for h in self.headers)
        expected = first.get("split.tensors.count")
        if expected is not None and int(expected) != total:
            raise GGUFError(
                f"{self.path}: split.tensors.count says {expected} tensors but the parts hold {total}"
            )

    def _check_extents(self) -> None:
        for name, (info, header) in self.tensor_infos.items():
            if info.nbytes >= 0 and info.offset + info.nbytes > header.file_size:
                raise GGUFError(
                    f"{header.path}: file is truncated: tensor {name} ends at byte "
                    f"{info.offset + info.nbytes} but the file has {header.file_size} bytes; "
                    "download it again"
                )

    def user_metadata(self) -> dict[str, Any]:
        """Metadata without the split bookkeeping keys."""
        return {k: v for k, v in self.metadata.items() if k not in _SPLIT_KEYS}
