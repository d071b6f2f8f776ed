"""Which packed types' tiles a MoE kernel compiles in, carried by a value's numba *type*.

A numba kernel compiles every tile variant its dispatch names (8 per type: 1-4 activation rows,
one or two planes), and every caller that links them optimizes them again (numba links each
callee's IR into the caller and runs the optimizer over the whole), so compile time grows with
the types named (docs/serving.md, start-up). The kernels take a TileSet: `tile_of(tiles, qtype,
...)` dispatches over its types alone, the others' branches pruned before typing (the flags in
`_dispatch` are frozen closure variables). The set travels as a numba type, not a value: numba
compiles one specialization per argument type, and a type survives the on-disk cache, calls
from jitted code and numba's fast dispatch from Python (a literal int argument did not; see
test_layer_driver).

A caller must pass a set holding every type it runs: a type outside the set leaves `res`
unwritten. `check_covers` is the Python entries' guard.
"""

from __future__ import annotations

import functools

from numba import njit
from numba.core import types
from numba.core.errors import TypingError
from numba.core.imputils import lower_constant
from numba.extending import (
    NativeValue,
    models,
    overload,
    register_model,
    typeof_impl,
    unbox,
)

from cpu_kernels.fast import packed_dot as kq
from cpu_kernels.fast import packed_dot_iq as iq
from cpu_kernels.fast.packed_dot import _call
from cpu_kernels.formats import qtypes as qt

# every type with packed tiles, K-quants (and Q8_0/Q5_0) first
KQUANT_TYPES = (qt.Q4_K, qt.Q6_K, qt.Q8_0, qt.Q5_0, qt.Q2_K, qt.Q3_K)
PACKED_TYPES = KQUANT_TYPES + (qt.IQ2_XXS, qt.IQ1_S, qt.IQ1_M, qt.IQ2_XS, qt.IQ2_S, qt.IQ3_XXS,
                               qt.IQ3_S, qt.IQ4_XS, qt.IQ4_NL, qt.MXFP4)


class TileSet:
    """A set of packed ggml types; make one with `tile_set` (one object per set)."""

    def __init__(self, qtypes: tuple[int, ...]) -> None:
        self.qtypes = qtypes  # sorted, distinct, each in PACKED_TYPES

    def __contains__(self, qtype: int) -> bool:
        return qtype in self.qtypes

    def __repr__(self) -> str:
        return f"TileSet({', '.join(qt.type_name(t) for t in self.qtypes)})"


class TileSetType(types.Type):
    """The numba type of a TileSet: its types are the type's key (one type per set)."""

    def __init__(self, qtypes: tuple[int, ...]) -> None:
        self.qtypes = qtypes
        super().__init__(name=f"TileSet{qtypes}")

    @property
    def key(self):
        return self.qtypes


@typeof_impl.register(TileSet)
def _typeof_tile_set(val, c):
    return TileSetType(val.qtypes)


register_model(TileSetType)(models.OpaqueModel)  # nothing at run time: all of it is the type


@unbox(TileSetType)
def _unbox_tile_set(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


@lower_constant(TileSetType)
def _constant_tile_set(context, builder, ty, pyval):
    return context.get_dummy_value()


@functools.cache
def _interned(qtypes: tuple[int, ...]) -> TileSet:
    return TileSet(qtypes)


def tile_set(qtypes) -> TileSet:
    """The TileSet of these ggml types (repeats and order do not matter); ValueError for a type
    without packed tiles."""
    distinct = tuple(sorted({int(t) for t in qtypes}))
    missing = [t for t in distinct if t not in PACKED_TYPES]
    if missing:
        raise ValueError(f"no packed tiles for {[qt.type_name(t) for t in missing]}")
    return _interned(distinct)


KQUANT_TILES = tile_set(KQUANT_TYPES)
ALL_TILES = tile_set(PACKED_TYPES)


def tile_family(*qtypes: int) -> TileSet:
    """The broad set for layers of these types, when nothing narrower is known: ALL_TILES where
    one is table-coded (an i-quant, MXFP4), else KQUANT_TILES (so a K-quant model never
    compiles the i-quants')."""
    return ALL_TILES if any(t in qt.TABLE_CODED for t in qtypes) else KQUANT_TILES


@functools.cache
def k_quants_of(tiles: TileSet) -> TileSet:
    """The set without its table-coded types: what the AMX kernel's VNNI half runs (its layers
    have none)."""
    return tile_set(t for t in tiles.qtypes if t not in qt.TABLE_CODED)


def check_covers(tiles: TileSet, *qtypes: int) -> None:
    """ValueError unless `tiles` holds every one of `qtypes` (a type outside it would be
    skipped by the kernels, leaving their output unwritten)."""
    outside = [qt.type_name(t) for t in qtypes if t not in tiles]
    if outside:
        raise ValueError(f"{tiles} lacks {outside}: pass a tile set with the layer's types")


def tile_of(tiles, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res):
    """res[16 i + l] = dot(row l of the pair, activation row t_i) for i < nt: the packed tile of
    `qtype` (one of `tiles`), arguments as in packed_tiles; `xsum16` is flat ([n * C/16]) and
    `lo_off` != 0 selects the two-plane tiles. Jitted callers only."""


@njit(cache=True)
def packed_tile(qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res) -> None:
    """tile_of over every packed type, callable from Python (tests, probes)."""
    tile_of(ALL_TILES, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res)


@overload(tile_of)
def _tile_of(tiles, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res):
    if not isinstance(tiles, TileSetType):
        raise TypingError(f"tile_of's first argument is a TileSet (tile_set.py), not {tiles}")
    return _dispatch(tiles.qtypes)


@functools.cache
def _dispatch(qtypes: tuple[int, ...]):
    """tile_of's body for one set: each `has_*` is a frozen closure variable, so numba prunes
    the branches of the types outside the set before typing them."""
    has_q4_k, has_q6_k, has_q8_0, has_q5_0, has_q2_k, has_q3_k, has_iq2_xxs, has_iq1_s, \
        has_iq1_m, has_iq2_xs, has_iq2_s, has_iq3_xxs, has_iq3_s, has_iq4_xs, has_iq4_nl, \
        has_mxfp4 = (t in qtypes for t in PACKED_TYPES)

    def impl(tiles, qtype, pa, pb, xq, lo_off, dx, xqsum, xsum16, t0, t1, t2, t3, nt, res):
        v = min(nt, 4) - 1 + (4 if lo_off != 0 else 0)  # the variant: rows, planes
        if has_q4_k and qtype == qt.Q4_K:  # Q4_K alone takes the per-32 sums
            _call(kq.Q4_K_0, kq.Q4_K_1, kq.Q4_K_2, kq.Q4_K_3, kq.Q4_K_4, kq.Q4_K_5, kq.Q4_K_6,
                  kq.Q4_K_7, v, pa, pb, xq, lo_off,
                  dx, xqsum, t0, t1, t2, t3, res)
        elif has_q6_k and qtype == qt.Q6_K:
            _call(kq.Q6_K_0, kq.Q6_K_1, kq.Q6_K_2, kq.Q6_K_3, kq.Q6_K_4, kq.Q6_K_5, kq.Q6_K_6,
                  kq.Q6_K_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_q8_0 and qtype == qt.Q8_0:
            _call(kq.Q8_0_0, kq.Q8_0_1, kq.Q8_0_2, kq.Q8_0_3, kq.Q8_0_4, kq.Q8_0_5, kq.Q8_0_6,
                  kq.Q8_0_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_q5_0 and qtype == qt.Q5_0:
            _call(kq.Q5_0_0, kq.Q5_0_1, kq.Q5_0_2, kq.Q5_0_3, kq.Q5_0_4, kq.Q5_0_5, kq.Q5_0_6,
                  kq.Q5_0_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_q2_k and qtype == qt.Q2_K:
            _call(kq.Q2_K_0, kq.Q2_K_1, kq.Q2_K_2, kq.Q2_K_3, kq.Q2_K_4, kq.Q2_K_5, kq.Q2_K_6,
                  kq.Q2_K_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_q3_k and qtype == qt.Q3_K:
            _call(kq.Q3_K_0, kq.Q3_K_1, kq.Q3_K_2, kq.Q3_K_3, kq.Q3_K_4, kq.Q3_K_5, kq.Q3_K_6,
                  kq.Q3_K_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq2_xxs and qtype == qt.IQ2_XXS:
            _call(iq.IQ2_XXS_0, iq.IQ2_XXS_1, iq.IQ2_XXS_2, iq.IQ2_XXS_3, iq.IQ2_XXS_4,
                  iq.IQ2_XXS_5, iq.IQ2_XXS_6, iq.IQ2_XXS_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq1_s and qtype == qt.IQ1_S:
            _call(iq.IQ1_S_0, iq.IQ1_S_1, iq.IQ1_S_2, iq.IQ1_S_3, iq.IQ1_S_4, iq.IQ1_S_5,
                  iq.IQ1_S_6, iq.IQ1_S_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq1_m and qtype == qt.IQ1_M:
            _call(iq.IQ1_M_0, iq.IQ1_M_1, iq.IQ1_M_2, iq.IQ1_M_3, iq.IQ1_M_4, iq.IQ1_M_5,
                  iq.IQ1_M_6, iq.IQ1_M_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq2_xs and qtype == qt.IQ2_XS:
            _call(iq.IQ2_XS_0, iq.IQ2_XS_1, iq.IQ2_XS_2, iq.IQ2_XS_3, iq.IQ2_XS_4, iq.IQ2_XS_5,
                  iq.IQ2_XS_6, iq.IQ2_XS_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq2_s and qtype == qt.IQ2_S:
            _call(iq.IQ2_S_0, iq.IQ2_S_1, iq.IQ2_S_2, iq.IQ2_S_3, iq.IQ2_S_4, iq.IQ2_S_5,
                  iq.IQ2_S_6, iq.IQ2_S_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq3_xxs and qtype == qt.IQ3_XXS:
            _call(iq.IQ3_XXS_0, iq.IQ3_XXS_1, iq.IQ3_XXS_2, iq.IQ3_XXS_3, iq.IQ3_XXS_4,
                  iq.IQ3_XXS_5, iq.IQ3_XXS_6, iq.IQ3_XXS_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq3_s and qtype == qt.IQ3_S:
            _call(iq.IQ3_S_0, iq.IQ3_S_1, iq.IQ3_S_2, iq.IQ3_S_3, iq.IQ3_S_4, iq.IQ3_S_5,
                  iq.IQ3_S_6, iq.IQ3_S_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq4_xs and qtype == qt.IQ4_XS:
            _call(iq.IQ4_XS_0, iq.IQ4_XS_1, iq.IQ4_XS_2, iq.IQ4_XS_3, iq.IQ4_XS_4, iq.IQ4_XS_5,
                  iq.IQ4_XS_6, iq.IQ4_XS_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_iq4_nl and qtype == qt.IQ4_NL:
            _call(iq.IQ4_NL_0, iq.IQ4_NL_1, iq.IQ4_NL_2, iq.IQ4_NL_3, iq.IQ4_NL_4, iq.IQ4_NL_5,
                  iq.IQ4_NL_6, iq.IQ4_NL_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
        elif has_mxfp4 and qtype == qt.MXFP4:
            _call(iq.MXFP4_0, iq.MXFP4_1, iq.MXFP4_2, iq.MXFP4_3, iq.MXFP4_4, iq.MXFP4_5,
                  iq.MXFP4_6, iq.MXFP4_7, v, pa, pb, xq, lo_off,
                  dx, xsum16, t0, t1, t2, t3, res)
    # a name of its own per set (cached callers link it): see packed_dot._specialize
    impl.__qualname__ = "tile_of_" + "_".join(map(str, qtypes))
    return impl
