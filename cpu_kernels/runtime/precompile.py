"""A first start's fast-mode MoE kernels compiled in background processes while the model loads.

numba compiles one function at a time in a process, and the packed MoE kernels are large (the
VNNI kernel a decode step runs, the AMX kernel of a prompt step; times in docs/serving.md):
compiled by the warm-up they run one after the other, after loading. Here each compiles in its
own process, started when loading starts, on tiny random experts of the file's
types and with the argument types the engine passes (the tile set of the file's packed types,
as the engine's pool passes it; read-only packed arrays, as the packed cache maps them;
C-contiguous float32/int64 activations, as run_moe makes them), so each lands
in numba's on-disk cache; the loading process waits for them before its warm-up and then reads
them from there. A process that fails or is stopped costs nothing but its time: the warm-up
compiles whatever is missing itself.

    python -m cpu_kernels.runtime.precompile GATE UP DOWN TOKENS TILES...
    (ggml type ids; TOKENS 1 or MIN_TOKENS; TILES the tile set's types, holding GATE UP DOWN)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

MIN_CORES = 8  # below this the processes would take the cores loading needs


def token_counts(types: tuple[int, int, int]) -> list[int]:
    """The step sizes whose kernels differ for layers of these types: 1 (VNNI), and
    amx_bf16_moe.MIN_TOKENS where this CPU runs those layers' prompt steps on AMX."""
    from cpu_kernels.amx.amx_bf16_moe import MIN_TOKENS, runs_on_amx

    return [1, MIN_TOKENS] if runs_on_amx(*types) else [1]


class BackgroundCompile:
    """The processes compiling one set of kernels; `wait` before the kernels are first
    called. Processes inherit the environment (NUMBA_CACHE_DIR and the thread settings)."""

    def __init__(self, types: tuple[int, int, int], tiles: tuple[int, ...]) -> None:
        self.types, self.tiles = types, tiles
        self.started = time.perf_counter()
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "cpu_kernels.runtime.precompile", *map(str, types), str(n),
             *map(str, tiles)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in token_counts(types)]

    @classmethod
    def start(cls, types: tuple[int, int, int], tiles: tuple[int, ...] | None = None,
              cores: int | None = None) -> BackgroundCompile | None:
        """Processes for layers of these expert types (gate, up, down) run with the tile set
        of `tiles` (default: the three types), or None where the machine has fewer than
        MIN_CORES cores or a type has no packed layout (nothing to do ahead)."""
        from cpu_kernels.fast.packed import can_pack

        cores = (os.cpu_count() or 1) if cores is None else cores
        tiles = tuple(sorted(set(types))) if tiles is None else tiles
        if cores < MIN_CORES or not all(can_pack(t) for t in (*types, *tiles)):
            return None
        return cls(types, tiles)

    def stop(self) -> None:
        """Stop the processes still running (a load that failed or was interrupted)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def wait(self, timeout: float = 600.0) -> list[int | None]:
        """Wait for every process (stopping any still running after `timeout` s); their exit
        codes, None for one stopped."""
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.0, timeout - (time.perf_counter() - self.started))))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes


def compile_kernels(types: tuple[int, int, int], tokens: int, tiles: tuple[int, ...]) -> None:
    """One call of the packed MoE on random experts of `types` with `tokens` tokens, all routed
    to expert 0 (so a MIN_TOKENS call reaches the AMX threshold), on the tile set of `tiles`."""
    from cpu_kernels.fast.packed import pack
    from cpu_kernels.fast.tile_set import tile_set
    from cpu_kernels.formats.random_blocks import random_experts
    from cpu_kernels.moe import run_moe

    rng = np.random.default_rng(0)
    experts = random_experts(rng, 2, 256, 256, *types)
    packed = pack(experts).packed
    for m in (packed.gate, packed.up, packed.down):
        m.data.flags.writeable = False  # as the packed cache maps them
    x = rng.standard_normal((tokens, 256)).astype(np.float32)  # [T, H]
    ids = np.zeros((tokens, 1), np.int64)  # [T, K]
    weights = np.ones((tokens, 1), np.float32)  # [T, K]
    out = np.empty_like(x)
    run_moe(x, ids, weights, experts, packed, 0, out, True, np.empty(2, np.int64),
            tiles=tile_set(tiles))


if __name__ == "__main__":
    gate, up, down, n, *tile_types = (int(a) for a in sys.argv[1:])
    compile_kernels((gate, up, down), n, tuple(tile_types))
