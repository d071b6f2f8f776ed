"""DeepSeek-V4's hyper-connection: the weights kernel against its reference (transformers'
arithmetic) over token counts, Sinkhorn iterations and scales, and the operator against
transformers' DeepseekV4HyperConnection on both kernel sets."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.hyper_connection import hc_weights, hc_weights_ref
from tests.gpu_kernels.conftest import rel_err


@pytest.mark.parametrize("tokens,iters", [(1, 20), (5, 1), (37, 20), (3, 7)])
def test_weights_match_the_reference(tokens: int, iters: int, device) -> None:
    n = 4
    g = torch.Generator().manual_seed(tokens)
    mix = 3 * torch.randn(tokens, (2 + n) * n, generator=g)
    base, scale = torch.randn((2 + n) * n, generator=g), torch.rand(3, generator=g) + 0.5
    want = hc_weights_ref(mix.double(), base.double(), scale.double(), n, iters, 1e-6)
    got = hc_weights(mix.to(device), base.to(device), scale.to(device), n, iters, 1e-6)
    for a, b in zip(got, want):
        assert a.shape == b.shape and rel_err(a.cpu().double(), b) < 1e-5
    comb = got[2].cpu().double()
    assert (comb.sum(-2) - 1).abs().max() < 1e-4  # its columns sum to 1 after the last pass


def test_other_stream_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        hc_weights(torch.zeros(1, 15), torch.zeros(15), torch.ones(3), 3, 20, 1e-6)


@pytest.mark.parametrize("on_gpu_kernels", [False, True])
def test_operator_equals_transformers(models, monkeypatch, device, on_gpu_kernels) -> None:
    """Each layer's two hyper-connections of the tiny V4 file, on random streams."""
    from hybrid.model.loader import load_model
    from hybrid.rules.inject import inject
    from hybrid.rules.planner import plan_model

    if on_gpu_kernels and device.type == "cpu":
        monkeypatch.setenv("HYBRID_GPU_KERNELS_ON_CPU", "1")
    target = device if on_gpu_kernels else torch.device("cpu")
    path = str(models.path("tiny-v4", "f32"))
    model = inject(plan_model(path, "DeepSeek-V4", announce=False,
                              device_map={"cuda": str(target)}))
    ref = load_model(path).model
    for name in ("model.layers.0.attn_hc", "model.layers.2.ffn_hc"):
        ours, theirs = model.get_submodule(name), ref.get_submodule(name)
        assert type(ours).__name__ == "HyperConnectionOp"
        assert ours.kernels.name == ("gpu_kernels" if on_gpu_kernels else "torch")
        streams = torch.randn(2, 7, theirs.hc_mult, ref.config.hidden_size,
                              generator=torch.Generator().manual_seed(1))  # [B, S, n, D]
        with torch.inference_mode():
            got = ours(streams.to(target))
            want = theirs(streams)
        for a, b in zip(got, want):
            assert a.shape == b.shape and rel_err(a.cpu(), b) < 1e-5, name
