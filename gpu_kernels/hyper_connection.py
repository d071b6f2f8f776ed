"""DeepSeek-V4's hyper-connection weights on the GPU: from a token's projected mixes to the
weights that collapse its `n` residual streams into a block's input (pre), expand the block's
output back into them (post) and mix the streams (comb, made doubly stochastic by Sinkhorn
iterations):

    pre  = sigmoid(mix[:n] * scale[0] + base[:n]) + eps                      [T, n]
    post = 2 sigmoid(mix[n:2n] * scale[1] + base[n:2n])                        [T, n]
    comb = softmax_rows(mix[2n:] * scale[2] + base[2n:]) + eps, then columns, then
           (rows, columns) iters - 1 more times normalized to sum 1 (+ eps)   [T, n, n]

In torch the Sinkhorn loop alone is two launches an iteration; here one program per token keeps
the n x n matrix in registers for the whole loop. `hc_weights_ref`
(transformers' DeepseekV4HyperConnection arithmetic) defines the result.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.reference import hc_weights_ref  # noqa: F401


@triton.jit
def _hc_weights_kernel(mix_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, iters, eps,
                       N: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    m = (2 + N) * N  # a token's mixes: pre, post, comb
    n = tl.arange(0, N)
    s0, s1, s2 = tl.load(scale_ptr), tl.load(scale_ptr + 1), tl.load(scale_ptr + 2)
    pre = tl.load(mix_ptr + t * m + n) * s0 + tl.load(base_ptr + n)
    tl.store(pre_ptr + t * N + n, 1.0 / (1.0 + tl.exp(-pre)) + eps)
    post = tl.load(mix_ptr + t * m + N + n) * s1 + tl.load(base_ptr + N + n)
    tl.store(post_ptr + t * N + n, 2.0 / (1.0 + tl.exp(-post)))
    ij = n[:, None] * N + n[None, :]  # [N, N] row-major
    c = tl.load(mix_ptr + t * m + 2 * N + ij) * s2 + tl.load(base_ptr + 2 * N + ij)
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = c / tl.sum(c, axis=1)[:, None] + eps  # softmax over each row
    c = c / (tl.sum(c, axis=0)[None, :] + eps)  # columns
    for _ in range(iters - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + eps)  # rows
        c = c / (tl.sum(c, axis=0)[None, :] + eps)  # columns
    tl.store(comb_ptr + t * N * N + ij, c)


def hc_weights(mix: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mix [T, (2 + n) n] f32, base [(2 + n) n], scale [3] -> (pre [T, n], post [T, n],
    comb [T, n, n]) f32; n a power of two (V4: 4)."""
    if n & (n - 1) or mix.shape[-1] != (2 + n) * n:
        raise ValueError(f"hc_weights: {n} streams (a power of two) need {(2 + n) * n} mixes "
                         f"a token, not {mix.shape[-1]}")
    t = mix.shape[0]
    mix = mix.contiguous()
    pre = torch.empty(t, n, dtype=torch.float32, device=mix.device)
    post = torch.empty_like(pre)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=mix.device)
    if t:
        _hc_weights_kernel[(t,)](mix, base.contiguous(), scale.contiguous(), pre, post, comb,
                                 iters, eps, N=n, num_warps=1)
    return pre, post, comb
