"""The MoE router's choice on the GPU, from the router logits to expert ids and weights.

V3 (sigmoid): scores = sigmoid(logits); the choice ranks scores + bias, limited to the
`topk_group` groups whose two best (biased) scores sum highest when n_group > 1; weights are
the unbiased scores of the chosen. V2 (softmax): scores = softmax(logits), greedy top-k. Then
weights are normalized when `norm_topk_prob`, and times `routed_scaling_factor`.
One program per token; top-k is k rounds of argmax (ties go to the lowest id, as in
torch.topk on distinct values). `route_ref` is the torch reference (transformers' order).

With a `Handover` (handshake.py: a whole-step graph's MoE layer whose routed experts run on
the CPU) each program also writes its token's rows, ids and weights into the pinned buffers,
and the last program to finish raises the layer's ready flag: one launch instead of the
route, three copies and the signal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpu_kernels.handshake import Handover, raise_flag
from gpu_kernels.reference import route_ref

SEND_BLOCK = 1024  # a row's columns copied to the host per step


@triton.jit
def _route_kernel(logit_ptr, bias_ptr, w_ptr, id_ptr, E, scale,
                  x_ptr, hx_ptr, hw_ptr, hid_ptr, H, fl_ptr, fl_index, seq_ptr, cnt_ptr,
                  SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
                  K: tl.constexpr, KP: tl.constexpr, G: tl.constexpr, TOPK_G: tl.constexpr,
                  BE: tl.constexpr, PER: tl.constexpr, SEND: tl.constexpr,
                  BX: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BE)
    em = e < E
    x = tl.load(logit_ptr + t * E + e, mask=em, other=float("-inf"))
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-x))
    else:
        ex = tl.exp(x - tl.max(x, axis=0))
        scores = ex / tl.sum(ex, axis=0)
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + e, mask=em, other=0.0)
    choice = tl.where(em, choice, float("-inf"))
    if G > 1:
        grouped = tl.reshape(choice, (G, PER))  # E == BE == G * PER here (route checks)
        first = tl.max(grouped, axis=1)
        col = tl.arange(0, PER)[None, :]
        first_at = tl.argmax(grouped, axis=1)
        second = tl.max(tl.where(col == first_at[:, None], float("-inf"), grouped), axis=1)
        gscore = first + second  # [G]
        gid = tl.arange(0, G)
        keep = tl.zeros((G,), tl.int1)
        for _ in tl.static_range(TOPK_G):
            best = tl.argmax(tl.where(keep, float("-inf"), gscore), axis=0)
            keep = keep | (gid == best)
        choice = tl.reshape(tl.where(keep[:, None], grouped, float("-inf")), (BE,))
    ks = tl.arange(0, KP)
    ids = tl.zeros((KP,), tl.int64)
    ws = tl.zeros((KP,), tl.float32)
    for k in tl.static_range(K):
        best = tl.argmax(choice, axis=0)
        ids = tl.where(ks == k, best.to(tl.int64), ids)
        ws = tl.where(ks == k, tl.sum(tl.where(e == best, scores, 0.0), axis=0), ws)
        choice = tl.where(e == best, float("-inf"), choice)
    if NORM:
        ws = ws / (tl.sum(ws, axis=0) + 1e-20)
    tl.store(w_ptr + t * K + ks, ws * scale, mask=ks < K)
    tl.store(id_ptr + t * K + ks, ids, mask=ks < K)
    if SEND:
        tl.store(hw_ptr + t * K + ks, ws * scale, mask=ks < K)
        tl.store(hid_ptr + t * K + ks, ids, mask=ks < K)
        for c0 in range(0, H, BX):
            c = c0 + tl.arange(0, BX)
            tl.store(hx_ptr + t * H + c, tl.load(x_ptr + t * H + c, mask=c < H), mask=c < H)
        tl.debug_barrier()  # the whole program's stores before its count (then the flag)
        if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.store(cnt_ptr, 0)  # the last one: every program's rows are written
            raise_flag(fl_ptr, fl_index, seq_ptr)


def route(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, sigmoid: bool,
          n_group: int, topk_group: int, norm_topk_prob: bool, scale: float,
          send: tuple[torch.Tensor, Handover] | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] f32 -> (weights [T, K] f32, ids [T, K] int64). send: (x [T, H] f32 on
    the device, where and how they go to the host): also x, ids and weights into its pinned
    buffers, then its flag raised, in stream order before whatever follows."""
    t, e = logits.shape
    if send is not None:
        x, to = send
        if x.shape[0] != t or not x.is_contiguous() or to.x.shape[1] != x.shape[1] \
                or to.ids.shape[1] != top_k or to.x.shape[0] < t:
            raise ValueError(f"route sends rows {tuple(x.shape)} and {top_k} choices each "
                             f"into host buffers {tuple(to.x.shape)}, {tuple(to.ids.shape)}")
    be = triton.next_power_of_2(e)
    if n_group > 1 and (be != e or e % n_group or n_group & (n_group - 1)):
        w, ids = route_ref(logits, bias, top_k, sigmoid, n_group, topk_group, norm_topk_prob,
                           scale)
        if send is not None:
            send[1].send(send[0], ids, w)
        return w, ids
    w = torch.empty(t, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if send is not None:
        hand = (x, to.x, to.weights, to.ids, x.shape[1], to.flags, to.index, to.seq, to.counter)
    else:
        hand = (logits, logits, w, ids, 0, logits, 0, logits, logits)  # not read
    if t:
        _route_kernel[(t,)](logits.contiguous(), bias if bias is not None else logits, w, ids, e,
                            scale, *hand, SIGMOID=sigmoid, HAS_BIAS=bias is not None,
                            NORM=norm_topk_prob, K=top_k, KP=triton.next_power_of_2(top_k),
                            G=n_group, TOPK_G=topk_group, BE=be, PER=be // max(n_group, 1),
                            SEND=send is not None, BX=SEND_BLOCK, num_warps=4)
    elif send is not None:
        send[1].send(send[0], ids, w)  # nothing to route: the flag still goes up
    return w, ids
