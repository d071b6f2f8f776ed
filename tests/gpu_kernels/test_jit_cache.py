"""The compiled-variant count that scripts/device_rules_check.py watches on the GPU, and the
token classes the model runner's warm-up runs: one per tile class of the product kernels."""

from __future__ import annotations

from gpu_kernels import qmatmul
from gpu_kernels.jit_cache import _kernels, compiled_variants, new_variants


def test_finds_every_launched_kernel() -> None:
    names = set(_kernels())
    for k in ("qmatmul._qmm_kernel", "qdot_i8._q4k_i8_kernel", "mla_prefill._prefill_kernel",
              "mla_decode._split_kernel", "fused._silu_mul_kernel", "router._route_kernel"):
        assert k in names
    assert all(isinstance(n, int) and n > 0 for n in compiled_variants().values())


def test_new_variants_names_only_what_grew() -> None:
    assert new_variants({"a": 1, "b": 2}, {"a": 1, "b": 4, "c": 1}) == {"b": 2, "c": 1}


def test_token_classes_cover_every_tile_class() -> None:
    seen = {qmatmul._tiles(m) for m in range(1, 3000)}
    assert seen == {qmatmul._tiles(m) for m in qmatmul.TOKEN_CLASSES}
    assert len(qmatmul.TOKEN_CLASSES) == len(seen)
