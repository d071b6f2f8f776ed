"""gpu_kernels/greedy_pick.py against its float64 reference: ids equal (ties to the lowest id,
across blocks too), log-probabilities within float32 rounding, the flag raised once."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.greedy_pick import PICK_BLOCK, greedy_pick, greedy_pick_ref


def _host(n: int, dtype) -> torch.Tensor:
    t = torch.zeros(n, dtype=dtype)
    return t.pin_memory() if torch.cuda.is_available() else t


@pytest.mark.parametrize("rows,vocab", [(1, 102400), (3, 129280), (16, 5000), (2, 1),
                                        (5, PICK_BLOCK), (4, PICK_BLOCK + 1), (0, 64)])
def test_picks_equal_the_reference(rows: int, vocab: int, device) -> None:
    g = torch.Generator().manual_seed(rows * 7919 + vocab)
    x = torch.randn(rows, vocab, generator=g) * 4
    if rows > 1 and vocab > PICK_BLOCK:  # a tie across blocks: the first one is the pick
        x[1, 7] = x[1, min(PICK_BLOCK + 3, vocab - 1)] = x[1].max() + 1
    if rows > 2:  # a tie in one block
        x[2, 11] = x[2, 5] = x[2].max() + 1
    logits = torch.cat([x, torch.zeros(rows, 3)], 1)[:, :vocab].to(device)  # strided rows
    carried = torch.full((rows + 2,), -1, dtype=torch.int64, device=device)
    ids, lp = _host(rows + 2, torch.int64), _host(rows + 2, torch.float32)
    greedy_pick(logits, carried, ids, lp)
    if device.type == "cuda":
        torch.cuda.synchronize()
    want_ids, want_lp = greedy_pick_ref(x)
    assert torch.equal(ids[:rows], want_ids) and torch.equal(carried[:rows].cpu(), want_ids)
    assert torch.allclose(lp[:rows], want_lp, atol=2e-5, rtol=1e-5)
    assert carried[rows:].tolist() == [-1, -1]
    if rows > 2:
        assert int(ids[2]) == 5 and (vocab <= PICK_BLOCK or int(ids[1]) == 7)


def test_the_flag_rises_once_every_row_is_written(device) -> None:
    rows, vocab = 6, 3000
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1))
    flags, seq = _host(2, torch.int64), torch.tensor([41], device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    carried = torch.zeros(rows, dtype=torch.int64, device=device)
    ids, lp = _host(rows, torch.int64), _host(rows, torch.float32)
    for step in (41, 42):  # the counter is back at 0 for the next launch
        seq.fill_(step)
        greedy_pick(x.to(device), carried, ids, lp, (flags, 1, seq, counter))
        if device.type == "cuda":
            torch.cuda.synchronize()
        assert flags.tolist() == [0, step] and int(counter) == 0
    assert torch.equal(ids, greedy_pick_ref(x)[0])


def test_refuses_what_it_cannot_take(device) -> None:
    x = torch.zeros(2, 8, device=device)
    ids, lp = _host(2, torch.int64), _host(2, torch.float32)
    with pytest.raises(ValueError, match="greedy_pick"):
        greedy_pick(x.half(), torch.zeros(2, dtype=torch.int64, device=device), ids, lp)
    with pytest.raises(ValueError, match="carried"):
        greedy_pick(x, torch.zeros(1, dtype=torch.int64, device=device), ids, lp)
