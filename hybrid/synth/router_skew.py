"""`make-model --router-skew S`: routers whose experts are chosen with skewed frequencies.

Real DeepSeek routing is far from uniform: per layer, a minority of experts takes most of the
tokens, and which ones differs from layer to layer. That skew is what GPU-resident "hot"
experts exploit (`hybrid tune`), so a synthetic model for tuning must have it. We give expert
of popularity rank r (1 = most chosen) a share of the layer's activations proportional to
r**-S, a Zipf law: the shape measured activation counts of MoE models take (a few heavy
experts, a long flat tail), with the exponent S as the one knob. S = 0 is uniform; S = 0.6
gives the 25% most chosen experts of a 64-expert layer about half of the activations, the
range expert-offloading studies report for DeepSeek-V2-Lite and Mixtral. Each layer ranks
its experts in its own random order.

The skew is written where V3-style routers have a knob: the selection bias
(`exp_probs_b.bias`, added to the sigmoid scores for the choice only). Its values are
calibrated by simulating the router (gpu_kernels.reference.route_ref, group limits included)
on random logits with the spread the synthetic gate weights give, so the simulated
frequencies match the targets; a real forward's hidden states are not that random, and
`hybrid profile` measures what the file really does. Softmax (V2) routers have no bias: a
skew there is refused.
"""

from __future__ import annotations

import numpy as np
import torch

from hybrid.errors import HybridError

GATE_LOGIT_STD = 2.0  # make_model's gate weights (std 2/sqrt(H)) on unit-RMS inputs


def zipf_shares(num_experts: int, top_k: int, skew: float) -> np.ndarray:
    """Each rank's expected activations per token: proportional to r**-skew, summing to top_k,
    none above 1 (an expert is chosen at most once per token; the excess is spread over the
    rest in proportion)."""
    want = np.arange(1, num_experts + 1, dtype=np.float64) ** -skew
    share = np.zeros(num_experts)
    free = np.ones(num_experts, bool)
    left = float(top_k)
    while True:
        share[free] = want[free] / want[free].sum() * left
        over = free & (share > 1.0)
        if not over.any():
            return share
        share[over] = 1.0
        left -= over.sum()
        free &= ~over


def calibrated_bias(shares: np.ndarray, top_k: int, n_group: int, topk_group: int,
                    seed: int, tokens: int = 8192, rounds: int = 60) -> np.ndarray:
    """The selection bias [E] under which simulated routing chooses each expert with
    frequency `shares` (per token)."""
    from gpu_kernels.reference import route_ref

    num_experts = shares.shape[0]
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, num_experts, generator=gen) * GATE_LOGIT_STD
    target = torch.from_numpy(shares).float()
    bias = torch.zeros(num_experts)
    for step in range(rounds):
        _, ids = route_ref(logits, bias, top_k, True, n_group, topk_group, False, 1.0)
        freq = torch.bincount(ids.flatten(), minlength=num_experts).float() / tokens
        # multiplicative error in log space; the step shrinks as the fit settles
        bias += 0.5 / (1 + step / 10) * (torch.log(target + 1e-4) - torch.log(freq + 1e-4))
    return bias.numpy().astype(np.float32)


def layer_bias(layer: int, num_experts: int, top_k: int, n_group: int, topk_group: int,
               skew: float, seed: int) -> np.ndarray:
    """Layer `layer`'s selection bias: Zipf shares in a random order of its own."""
    rng = np.random.default_rng([seed, layer, 0x5CE7])
    order = rng.permutation(num_experts)  # order[r]: the expert of popularity rank r
    shares = np.empty(num_experts)
    shares[order] = zipf_shares(num_experts, top_k, skew)
    return calibrated_bias(shares, top_k, n_group, topk_group, seed * 1000 + layer)


def check_skew(skew: float, sigmoid_gating: bool, preset: str) -> None:
    if skew < 0:
        raise HybridError(f"--router-skew must be >= 0 (0: uniform), got {skew}")
    if skew > 0 and not sigmoid_gating:
        raise HybridError(f"--router-skew needs a router with a selection bias (V3-style "
                          f"sigmoid routing: v3, moonlight, kimi-k2 and their tiny presets); "
                          f"{preset} routes by softmax alone")
