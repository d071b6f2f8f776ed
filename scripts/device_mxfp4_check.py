"""MXFP4 in gpu_kernels on a real GPU: the Triton tile and the embedding equal the reference bit
for bit (denormal and inf scales included), the products (qmatmul, qmatmul_t, moe_experts)
match their float64 references. Run on the GPU machine: `PYTHONPATH=. python3
scripts/device_mxfp4_check.py` (no wheels needed); it prints a line per check, the worst
product error last, and fails on a mismatch."""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels.dequant_ref import dequantize
from gpu_kernels.dequant_rows import dequant_rows
from gpu_kernels.dequant_tile import embedding, embedding_ref
from gpu_kernels.moe_grouped import moe_experts, moe_experts_ref
from gpu_kernels.qformat import to_planes
from gpu_kernels.qmatmul import qmatmul, qmatmul_ref, qmatmul_t, qmatmul_t_ref


def rows(r, c, lo, hi, seed):
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, (r, c // 32, 17), dtype=np.uint8)
    raw[..., 0] = g.integers(lo, hi, (r, c // 32))
    return raw.reshape(r, -1)


def w(r, c, seed, lo=117, hi=123):
    return to_planes(torch.from_numpy(rows(r, c, lo, hi, seed)), 39, r, c).to("cuda")


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


print(torch.cuda.get_device_name())
raw = rows(12, 320, 110, 126, 0)
raw.reshape(-1, 17)[:3, 0] = [0, 1, 254]
q = to_planes(torch.from_numpy(raw), 39, 12, 320).to("cuda")
ref = dequantize(q)
tile = dequant_rows(q, 12)[0]
same = torch.equal(tile.view(torch.int32), ref.view(torch.int32))
print("tile == ref bitwise:", same)
assert same
print("e=0 block:", tile[0, :4].tolist(), "e=254 block:", tile[0, 64:68].tolist())
ids = torch.tensor([3, 11, 0, 3], device="cuda")
same = torch.equal(embedding(ids, q).view(torch.int32), embedding_ref(ids, q).view(torch.int32))
print("embedding exact:", same)
assert same
worst = 0.0
for r, c in [(37, 512), (33, 320), (2048, 2048)]:
    wt = w(r, c, c)
    for m in (1, 2, 3, 8, 12, 64, 300):
        x = torch.randn(m, c, device="cuda")
        e = rel(qmatmul(x, wt), qmatmul_ref(x, wt))
        worst = max(worst, e)
        print(f"qmatmul {r}x{c} M={m}: {e:.2e}")
wt = w(3 * 56, 256, 7)
for m in (1, 16):
    xn = torch.randn(m, 3, 32, device="cuda")
    print(f"qmatmul_t M={m}:", rel(qmatmul_t(xn, wt, 32, 0, 56), qmatmul_t_ref(xn, wt, 32, 0, 56)))
for n in (6, 24, 200):
    g, u, d = w(4 * 256, 256, 1), w(4 * 256, 256, 2), w(4 * 256, 256, 3)
    ids = torch.stack([torch.randperm(4)[:2] for _ in range(n)]).cuda()
    wts = torch.rand(n, 2, device="cuda")
    x = torch.randn(n, 256, device="cuda")
    print(f"moe n={n}:", rel(moe_experts(x, ids, wts, (g, u), d, 4),
                             moe_experts_ref(x, ids, wts, g, u, d, 4)))
print("worst qmatmul rel err:", worst)
assert worst < 1e-5
