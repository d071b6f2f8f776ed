"""Environment knobs, all in one typed place (`HYBRID_*`). Read once, where needed; never mutated."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Env:
    cache_dir: Path  # HYBRID_CACHE_DIR: where the demo model is built (default ~/.cache/hybrid)
    # HYBRID_GPU_KERNELS_ON_CPU=1: operators placed on the CPU run the GPU kernels too, in
    # Triton's interpreter (TRITON_INTERPRET=1): the GPU path tested end to end without a GPU
    gpu_kernels_on_cpu: bool = False

    @classmethod
    def read(cls) -> Env:
        default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybrid"
        return cls(cache_dir=Path(os.environ.get("HYBRID_CACHE_DIR", default)).expanduser(),
                   gpu_kernels_on_cpu=os.environ.get("HYBRID_GPU_KERNELS_ON_CPU") == "1")
