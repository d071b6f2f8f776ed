"""Fast mode's packed experts kept on disk, memory-mapped on the next start.

Packing a V3's routed experts reads ~350 GB; a second start should cost little more than paging
the files in. Each MoE layer's packed copy (cpu_kernels.fast.packed: gate, up, down) is written once
to `<root>/<model>-<key>/blk.<L>.<part>.npy` and opened read-only with np.load(mmap_mode="r")
afterwards: the kernels read it straight from the page cache, and a restart reuses the pages the
last run left there.

The key covers what the bytes depend on: every GGUF part's resolved path, size and mtime, and
LAYOUT_VERSION (bump it whenever cpu_kernels/fast/packed.py's layouts change). A file whose shape or
type does not match what the layer expects is ignored and rewritten; a write goes to a temporary
name first and is renamed into place, so a crash mid-write leaves no half file behind. When the
disk lacks room the layer is packed in memory as before and the log says why (once).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cpu_kernels.fast.packed import PackedExperts, PackedMatrix, packed_shape
from cpu_kernels.formats.weights import ExpertWeights
from hybrid.env import Env
from hybrid.gguf.reader import GGUFModelFile

LAYOUT_VERSION = 1
PARTS = ("gate", "up", "down")
# leave this much of the disk free (the page cache and the user's other files need it)
_FREE_MARGIN = 4 << 30
log = logging.getLogger(__name__)


def model_key(gguf: GGUFModelFile) -> str:
    """A short hash naming this exact set of files and the packed layout's version."""
    h = hashlib.sha256(f"packed-layout-{LAYOUT_VERSION}".encode())
    for part in gguf.parts:
        st = part.stat()
        h.update(f"{part.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class PackedCache:
    """The cache of one model's packed experts under `root` (default: Env.packed_cache_dir)."""

    folder: Path

    @classmethod
    def for_model(cls, gguf: GGUFModelFile, root: Path | None = None) -> PackedCache:
        root = root if root is not None else Env.read().packed_cache_dir
        stem = gguf.parts[0].name.removesuffix(".gguf")
        return cls(root / f"{stem}-{model_key(gguf)}")

    def _path(self, layer: int, part: str) -> Path:
        return self.folder / f"blk.{layer}.{part}.npy"

    def load(self, layer: int, experts: ExpertWeights) -> PackedExperts | None:
        """The layer's packed copy if all three files are there and fit `experts`."""
        mats = []
        for part, w in zip(PARTS, (experts.gate, experts.up, experts.down)):
            path = self._path(layer, part)
            if not path.is_file():
                return None
            try:
                data = np.load(path, mmap_mode="r")
            except (OSError, ValueError):
                return None
            if data.dtype != np.uint8 or data.shape != packed_shape(w.qtype, *w.shape):
                return None
            mats.append(PackedMatrix(w.qtype, w.shape, data))
        return PackedExperts(*mats)

    def store(self, layer: int, packed: PackedExperts) -> PackedExperts:
        """Write the layer's copy and return it re-opened from disk (its pages then belong to
        the page cache, not to this process's heap); the in-memory copy if the disk is short."""
        mats = (packed.gate, packed.up, packed.down)
        need = sum(m.nbytes for m in mats)
        self.folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.folder).free
        if free < need + _FREE_MARGIN:
            log.warning("packed-expert cache: %s has %.1f GB free, layer %d needs %.1f GB (and "
                        "%.0f GB kept free); packing in memory", self.folder, free / 1e9, layer,
                        need / 1e9, _FREE_MARGIN / 1e9)
            return packed
        for part, m in zip(PARTS, mats):
            path = self._path(layer, part)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "wb") as f:
                np.save(f, m.data)
            os.replace(tmp, path)
        return PackedExperts(*(PackedMatrix(m.qtype, m.shape, np.load(
            self._path(layer, part), mmap_mode="r")) for part, m in zip(PARTS, mats)))
