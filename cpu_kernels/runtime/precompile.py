"""A first start's fast-mode MoE kernels compiled in background processes while the model loads.

numba compiles one function at a time in a process, and the packed MoE kernels are large (the
VNNI kernel a decode step runs, the AMX kernel of a prompt step; times in docs/serving.md):
compiled by the warm-up they run one after the other, after loading. Here each compiles in its
own process, started when loading starts, on tiny random experts of the file's
types and with the argument types the engine passes (the tile set of the file's packed types,
as the engine's pool passes it; read-only packed arrays, as the packed cache maps them;
C-contiguous float32/int64 activations, as run_moe makes them), so each lands
in numba's on-disk cache; the loading process waits for them before its warm-up and then reads
them from there. The decode step's one-call driver (layer_driver.py) for the engine's number
of layers compiles in a process of its own, beside the 1-token kernel's: the two share
their inner functions (each process compiles them), so a first start waits for the longer of
the two compiles, not for their sum.
A process that fails or is stopped costs nothing but its time: the warm-up compiles whatever
is missing itself.

The load-time packers (pack_kernels.py) compile the same way, one process a type, started
before the plan is made (BackgroundPackers): the loader's first pack of a layer would otherwise
compile them in the loading process, before anything else loads.

    python -m cpu_kernels.runtime.precompile GATE UP DOWN TOKENS TILES...
    python -m cpu_kernels.runtime.precompile driver GATE UP DOWN LAYERS TILES...
    (ggml type ids; TOKENS 1 or MIN_TOKENS; LAYERS the driver's; TILES the tile set's types,
    holding GATE UP DOWN)
    python -m cpu_kernels.runtime.precompile pack TYPE
"""

from __future__ import annotations

import math
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


class BackgroundProcesses:
    """Compile processes (this module run with `argvs`) started now; `wait` before their
    kernels are first called, `stop` where a load fails. They inherit the environment
    (NUMBA_CACHE_DIR and the thread settings)."""

    def __init__(self, argvs: list[list[str]], timeout: float) -> None:
        self.started = time.perf_counter()
        self.timeout = timeout
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "cpu_kernels.runtime.precompile", *argv],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for argv in argvs]

    def stop(self) -> None:
        """Stop the processes still running (a load that failed or was interrupted)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def wait(self, timeout: float | None = None) -> list[int | None]:
        """Wait for every process, stopping any still running `timeout` s (default: the
        processes' own) after the start (whoever calls the kernels then compiles what is
        missing); their exit codes, None for one stopped."""
        limit = self.timeout if timeout is None else timeout
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.0, limit - (time.perf_counter() - self.started))))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes


class BackgroundCompile(BackgroundProcesses):
    """The processes compiling one set of MoE kernels, one a token count (token_counts), and
    one the one-call driver of `drive_layers` layers (none for 0)."""

    def __init__(self, types: tuple[int, int, int], tiles: tuple[int, ...],
                 drive_layers: int) -> None:
        self.types, self.tiles = types, tiles
        kernels = [[*map(str, types), str(n), *map(str, tiles)] for n in token_counts(types)]
        driver = [["driver", *map(str, types), str(drive_layers), *map(str, tiles)]]
        super().__init__(kernels + (driver if drive_layers else []), timeout=600.0)

    @classmethod
    def start(cls, types: tuple[int, int, int], tiles: tuple[int, ...] | None = None,
              drive_layers: int = 0, cores: int | None = None) -> BackgroundCompile | None:
        """Processes for layers of these expert types (gate, up, down) run with the tile set
        of `tiles` (default: the three types), the one-call driver for `drive_layers` layers
        (0: none), or None where the machine has fewer than MIN_CORES cores or a type has no
        packed layout (nothing to do ahead)."""
        from cpu_kernels.fast.packed import can_pack

        cores = (os.cpu_count() or 1) if cores is None else cores
        tiles = tuple(sorted(set(types))) if tiles is None else tiles
        if cores < MIN_CORES or not all(can_pack(t) for t in (*types, *tiles)):
            return None
        return cls(types, tiles, drive_layers)


class BackgroundPackers(BackgroundProcesses):
    """The processes compiling the load-time packers of some types, one a type."""

    def __init__(self, types: tuple[int, ...]) -> None:
        self.types = types
        super().__init__([["pack", str(t)] for t in types], timeout=120.0)

    @classmethod
    def start(cls, types: set[int] | tuple[int, ...], cores: int | None = None
              ) -> BackgroundPackers | None:
        """Processes for the packable ones of `types`, or None where there are none or the
        machine has fewer than MIN_CORES cores."""
        from cpu_kernels.fast.packed import can_pack

        cores = (os.cpu_count() or 1) if cores is None else cores
        packable = tuple(sorted(t for t in set(types) if can_pack(t)))
        return cls(packable) if packable and cores >= MIN_CORES else None


def compile_packer(qtype: int) -> None:
    """One pack of 8 rows of one expert of `qtype`, with the argument types the loader passes
    (packed.PackedMatrix.of: the GGUF's blocks a read-only C-contiguous uint8 [E, rows, row
    bytes] map, Python ints, a fresh C-contiguous output)."""
    from cpu_kernels.fast.pack_kernels import pack_blocks
    from cpu_kernels.fast.packed import PACKED_GEOMETRY, ROWS, packed_shape
    from cpu_kernels.formats import qtypes as qt

    block_cols, packed_bytes = PACKED_GEOMETRY[qtype]
    blocks = np.zeros((1, ROWS, qt.row_nbytes(qtype, block_cols)), np.uint8)  # [E, rows, bytes]
    blocks.flags.writeable = False
    out = np.empty(packed_shape(qtype, 1, ROWS, block_cols), np.uint8)
    pack_blocks(qtype, blocks, 0, ROWS, 0, qt.BLOCK_GEOMETRY[qtype][1], packed_bytes, out)


def _tiny_packed(types: tuple[int, int, int]):
    """(experts, their packed copy) of 2 random experts of `types`, H = I = 256, the packed
    arrays read-only as the packed cache maps them."""
    from cpu_kernels.fast.packed import pack
    from cpu_kernels.formats.random_blocks import random_experts

    experts = random_experts(np.random.default_rng(0), 2, 256, 256, *types)
    packed = pack(experts).packed
    for m in (packed.gate, packed.up, packed.down):
        m.data.flags.writeable = False
    return experts, packed


def compile_kernels(types: tuple[int, int, int], tokens: int, tiles: tuple[int, ...]) -> None:
    """One call of the packed MoE on random experts of `types` with `tokens` tokens, all routed
    to expert 0 (so a MIN_TOKENS call reaches the AMX threshold), on the tile set of `tiles`."""
    from cpu_kernels.fast.tile_set import tile_set
    from cpu_kernels.moe import run_moe

    experts, packed = _tiny_packed(types)
    x = np.random.default_rng(0).standard_normal((tokens, 256)).astype(np.float32)  # [T, H]
    ids = np.zeros((tokens, 1), np.int64)  # [T, K]
    weights = np.ones((tokens, 1), np.float32)  # [T, K]
    out = np.empty_like(x)
    run_moe(x, ids, weights, experts, packed, 0, out, True, np.empty(2, np.int64),
            tiles=tile_set(tiles))


def compile_driver(types: tuple[int, int, int], tiles: tuple[int, ...], num_layers: int) -> None:
    """One pass of drive_layers over `num_layers` layers of random experts of `types`, with the
    argument types the engine's HostExperts passes (flags and buffers as numpy views of its
    pinned tensors: C-contiguous int64 / float32)."""
    from cpu_kernels.fast.tile_set import tile_set
    from cpu_kernels.runtime.layer_driver import drive_layers, of_tuples

    _, pk = _tiny_packed(types)
    layer = (pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype, pk.down.data,
             math.inf)  # as layer_driver.packed_layers makes it (the SwiGLU clamp last)
    ready, done = np.zeros(num_layers, np.int64), np.zeros(num_layers, np.int64)  # seq 0: pass
    x, out = np.zeros((1, 256), np.float32), np.zeros((1, 256), np.float32)  # [T, H]
    ids, weights = np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32)  # [T, K]
    layers = of_tuples((layer,) * num_layers)
    drive_layers(ready, done, 0, 1, x, ids, weights, out,
                 layers._replace(tiles=tile_set(tiles)), 10**12)


if __name__ == "__main__":
    if sys.argv[1] == "pack":
        compile_packer(int(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1] == "driver":
        gate, up, down, num_layers, *tile_types = (int(a) for a in sys.argv[2:])
        compile_driver((gate, up, down), tuple(tile_types), num_layers)
        sys.exit(0)
    gate, up, down, n, *tile_types = (int(a) for a in sys.argv[1:])
    compile_kernels((gate, up, down), n, tuple(tile_types))
