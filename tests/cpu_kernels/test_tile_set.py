"""Tile sets (cpu_kernels/fast/tile_set.py): the set a MoE kernel compiles in. A kernel given a
narrow set compiles only its types' tiles and equals the reference; a pool gives all its layers
one set; a set that lacks a layer's type is refused before any kernel runs."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from cpu_kernels.fast.packed import pack
from cpu_kernels.fast.packed_moe import packed_moe
from cpu_kernels.fast.tile_set import (
    ALL_TILES,
    KQUANT_TILES,
    k_quants_of,
    tile_family,
    tile_set,
)
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts
from cpu_kernels.formats.reference import moe_forward_ref, rel_error
from cpu_kernels.runtime.pool import MoEPool

FAST_TOL = 1e-2  # test_moe's


def test_one_set_object_per_set_of_types() -> None:
    assert tile_set([qt.Q6_K, qt.Q4_K, qt.Q4_K]) is tile_set((qt.Q4_K, qt.Q6_K))
    assert tile_set([qt.Q4_K]).qtypes == (qt.Q4_K,)
    assert qt.Q6_K in tile_set([qt.Q6_K]) and qt.Q4_K not in tile_set([qt.Q6_K])
    with pytest.raises(ValueError, match="Q5_K"):
        tile_set([qt.Q4_K, qt.Q5_K])  # no packed layout


def test_broad_families_and_the_amx_half() -> None:
    assert tile_family(qt.Q4_K, qt.Q4_K, qt.Q6_K) is KQUANT_TILES
    assert tile_family(qt.IQ1_S, qt.Q4_K, qt.Q6_K) is ALL_TILES
    assert k_quants_of(ALL_TILES) is KQUANT_TILES
    assert k_quants_of(tile_set([qt.IQ2_XXS, qt.Q4_K])) is tile_set([qt.Q4_K])


def _call(experts, rng, tiles=None):
    pk = pack(experts).packed
    x = rng.standard_normal((5, 256)).astype(np.float32)  # [T, H]
    ids = np.stack([rng.choice(8, 2, replace=False) for _ in range(5)])  # [T, K]
    w = rng.random((5, 2)).astype(np.float32)  # [T, K]
    out = np.zeros_like(x)
    packed_moe(pk.gate.qtype, pk.gate.data, pk.up.qtype, pk.up.data, pk.down.qtype, pk.down.data,
               x, ids, w, math.inf, out, np.zeros(2, np.int64), 2, tiles)
    return out, moe_forward_ref(x, ids, w, experts)


@pytest.mark.parametrize("types", [(qt.Q4_K, qt.Q4_K, qt.Q6_K), (qt.Q8_0, qt.Q8_0, qt.Q8_0)])
def test_a_narrow_set_equals_the_reference(types) -> None:
    rng = np.random.default_rng(11)
    out, want = _call(random_experts(rng, 8, 256, 256, *types), rng, tile_set(types))
    assert rel_error(out, want) <= FAST_TOL


def test_a_set_without_the_layers_type_is_refused() -> None:
    rng = np.random.default_rng(12)
    experts = random_experts(rng, 8, 256, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K)
    with pytest.raises(ValueError, match="lacks.*Q6_K"):
        _call(experts, rng, tile_set([qt.Q4_K]))


def test_a_pool_runs_all_its_layers_on_the_union_of_their_types() -> None:
    rng = np.random.default_rng(13)
    pool = MoEPool(threads=1)
    layers = [random_experts(rng, 8, 256, 256, qt.Q4_K, qt.Q4_K, qt.Q6_K),
              random_experts(rng, 8, 256, 256, qt.Q4_K, qt.Q4_K, qt.Q4_K)]
    placed = [pool.place(e, mode="fast") for e in layers]
    pool.place(random_experts(rng, 8, 256, 256, qt.Q8_0, qt.Q8_0, qt.Q8_0), mode="exact")
    assert pool.tiles is tile_set([qt.Q4_K, qt.Q6_K])  # exact-mode layers run no tiles
    x = rng.standard_normal((3, 256)).astype(np.float32)
    ids = np.stack([rng.choice(8, 2, replace=False) for _ in range(3)])
    w = rng.random((3, 2)).astype(np.float32)
    for experts, p in zip(layers, placed):
        out = pool.run_inline(x, ids, w, p, np.zeros_like(x))
        assert rel_error(out, moe_forward_ref(x, ids, w, experts)) <= FAST_TOL
    pool.close()


_ONLY_ITS_TILES = """
import math

import numpy as np
from cpu_kernels.fast import packed_dot as kq
from cpu_kernels.fast.packed import pack
from cpu_kernels.fast.packed_moe import packed_moe
from cpu_kernels.fast.tile_set import tile_set
from cpu_kernels.formats import qtypes as qt
from cpu_kernels.formats.random_blocks import random_experts

e = random_experts(np.random.default_rng(0), 2, 256, 256, qt.Q8_0, qt.Q8_0, qt.Q8_0)
pk = pack(e).packed
x = np.ones((1, 256), np.float32)
packed_moe(qt.Q8_0, pk.gate.data, qt.Q8_0, pk.up.data, qt.Q8_0, pk.down.data, x,
           np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32), math.inf, np.zeros_like(x),
           np.zeros(2, np.int64), 1, tile_set([qt.Q8_0]))
compiled = {name for name in dir(kq) if name[-2] == "_" and name[-1].isdigit()
            and getattr(kq, name).signatures}
print(sorted({name[:-2] for name in compiled}))
"""


def test_a_kernel_compiles_only_its_sets_tiles(tmp_path) -> None:
    """In a fresh process (no other kernel compiled there) with its own numba cache: a Q8_0
    set's kernel leaves every other K-quant's tile variants uncompiled."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _ONLY_ITS_TILES], capture_output=True,
                          text=True, env=env, timeout=600, check=True)
    assert done.stdout.split("\n")[-2] == "['Q8_0']"



def test_every_compiled_variant_has_a_name_of_its_own() -> None:
    """numba names compiled code by qualified name, argument types and a per-process counter.
    The tile variants (and the per-type packers, and tile_of's per-set bodies) share a body
    and argument types: compiled in different processes (the on-disk cache, a first start's
    background compile) two with one qualified name could get one symbol, and a process
    loading both ran one for the other (the broad kernel gave NaN after a Q8_0 set's kernel
    was compiled elsewhere). Each carries a name of its own."""
    from cpu_kernels.fast import pack_kernels
    from cpu_kernels.fast import packed_dot as kq
    from cpu_kernels.fast import packed_dot_iq as iq
    from cpu_kernels.fast.tile_set import PACKED_TYPES, _dispatch

    variants = [getattr(m, n) for m in (kq, iq) for n in dir(m)
                if n[-2] == "_" and n[-1].isdigit() and hasattr(getattr(m, n), "py_func")]
    assert len(variants) == 8 * len(PACKED_TYPES)
    names = {v.py_func.__qualname__ for v in variants}
    names |= {pack_kernels._kernel(t).py_func.__qualname__ for t in PACKED_TYPES}
    names |= {_dispatch(s).__qualname__ for s in ((qt.Q8_0,), (qt.Q5_0, qt.Q8_0), PACKED_TYPES)}
    assert len(names) == len(variants) + len(PACKED_TYPES) + 3
