"""Environment knobs, all in one typed place (`HYBRID_*`). Read once, where needed; never mutated."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Env:
    cache_dir: Path  # HYBRID_CACHE_DIR: where the demo model is built (default ~/.cache/hybrid)
    # HYBRID_PACKED_CACHE_DIR: fast mode's packed experts (default <cache_dir>/packed)
    packed_cache_dir: Path
    # HYBRID_GPU_KERNELS_ON_CPU=1: operators placed on the CPU run the GPU kernels too, in
    # Triton's interpreter (TRITON_INTERPRET=1): the GPU path tested end to end without a GPU
    gpu_kernels_on_cpu: bool = False

    @classmethod
    def read(cls) -> Env:
        default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybrid"
        cache_dir = Path(os.environ.get("HYBRID_CACHE_DIR", default)).expanduser()
        packed = Path(os.environ.get("HYBRID_PACKED_CACHE_DIR", cache_dir / "packed")).expanduser()
        return cls(cache_dir=cache_dir, packed_cache_dir=packed,
                   gpu_kernels_on_cpu=os.environ.get("HYBRID_GPU_KERNELS_ON_CPU") == "1")
