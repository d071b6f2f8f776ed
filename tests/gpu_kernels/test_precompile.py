"""gpu_kernels.precompile: a dry run records the variants a launch needs and launches nothing; a pool
of threads compiles them; the real run then compiles nothing and computes as before. Triton's
JIT hooks run only on a GPU (the interpreter compiles nothing): the recording tests run there
(scripts/device_start_up.sh runs this file first), the rest everywhere."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F

from gpu_kernels import fused, precompile

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton's JIT hooks need CUDA")


def test_not_available_off_cuda() -> None:
    assert not precompile.available(torch.device("cpu"))


@pytest.fixture
def fresh_silu_mul(monkeypatch):
    """The kernel with no variant compiled in this process (its on-disk cache may hold them)."""
    kernel = fused._silu_mul_kernel
    monkeypatch.setattr(kernel, "device_caches", defaultdict(kernel.create_binder))
    return kernel


def _compiled(kernel) -> int:
    return sum(len(c[0]) for c in kernel.device_caches.values())


@cuda
def test_a_dry_run_records_each_variant_once_and_launches_nothing(fresh_silu_mul) -> None:
    assert precompile.available(torch.device("cuda"))
    gu = torch.randn(3, 2 * 96, device="cuda")
    out = torch.full((3, 96), 7.0, device="cuda")
    with precompile.recording() as recorded:
        fused.silu_mul(gu, out=out)
        fused.silu_mul(gu, out=out)  # the same variant: recorded once
        fused.silu_mul(gu, out=out, limit=3.0)  # CLAMP=True: another
    torch.cuda.synchronize()
    assert len(recorded) == 2
    assert bool((out == 7.0).all())  # nothing ran
    assert _compiled(fresh_silu_mul) == 0
    assert {v[2] for v in recorded.values()} == {torch.cuda.current_device()}


@cuda
def test_the_pool_compiles_what_was_recorded_and_the_real_run_compiles_nothing(
        fresh_silu_mul) -> None:
    gu = torch.randn(5, 2 * 2048, device="cuda")
    limits = (math.inf, 2.5)
    with precompile.recording() as recorded:
        for limit in limits:
            fused.silu_mul(gu, limit=limit)
    assert precompile.Precompile(recorded, threads=4).wait() == 0
    assert _compiled(fresh_silu_mul) == len(recorded) == 2
    g, u = gu.chunk(2, dim=-1)
    for limit in limits:
        got = fused.silu_mul(gu, limit=limit)
        gc, uc = (g.clamp(max=limit), u.clamp(min=-limit, max=limit)) if limit != math.inf \
            else (g, u)
        torch.testing.assert_close(got, F.silu(gc) * uc, rtol=1e-5, atol=1e-5)
    assert _compiled(fresh_silu_mul) == 2  # nothing compiled on launch


@cuda
def test_the_hook_is_restored_after_recording() -> None:
    from triton import knobs

    before = knobs.runtime.jit_cache_hook
    with pytest.raises(RuntimeError), precompile.recording():
        raise RuntimeError("work failed")
    assert knobs.runtime.jit_cache_hook is before


@cuda
def test_a_variant_that_fails_twice_is_counted_and_left_to_its_launch(fresh_silu_mul) -> None:
    bad = {("bad",): (fresh_silu_mul, "{not json", torch.cuda.current_device())}
    assert precompile.Precompile(bad, threads=2).wait() == 1
    assert _compiled(fresh_silu_mul) == 0


def test_no_string_constexpr_reads_back_as_a_dtype() -> None:
    """JITFunction.preload (the pool's compile) turns a string constexpr that names a Triton
    dtype ("fp16", "bf16") into that dtype: the variant compiled from the record would not be
    the one launched (mla_prefill_expanded's fp16 variant failed so)."""
    import triton.language as tl

    from gpu_kernels.compile_check import variants

    named = [(v.name, k, c) for v in variants() for k, c in v.constexprs.items()
             if isinstance(c, str) and tl.dtype.is_dtype(c)]
    assert not named
