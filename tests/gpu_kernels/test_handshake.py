"""The GPU side of the CPU-experts hand-over, against its reference: signal writes the step's
sequence number; wait passes on an equal flag and reports a stale one after its spins; fetch
reads the experts' answer (and the step's number) from pinned memory."""

from __future__ import annotations

import pytest
import torch

from gpu_kernels.handshake import (
    fetch,
    fetch_ref,
    signal,
    signal_ref,
    wait,
    wait_ref,
)


def _host(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64, pin_memory=torch.cuda.is_available())


@pytest.mark.parametrize("index", [0, 2])
def test_signal(index: int, device) -> None:
    flags, ref = _host(3), torch.zeros(3, dtype=torch.int64)
    seq = torch.tensor([41], device=device)
    signal(flags, index, seq)
    signal_ref(ref, index, seq)
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert flags.tolist() == ref.tolist()


@pytest.mark.parametrize("flag,seq", [(7, 7), (6, 7), (8, 7)])
def test_wait(flag: int, seq: int, device) -> None:
    flags = _host(2)
    flags[1] = flag
    s = torch.tensor([seq], device=device)
    error, ref = torch.zeros(1, dtype=torch.int32, device=device), torch.zeros(1, dtype=torch.int32)
    wait(flags, 1, s, error, max_spins=50)
    wait_ref(flags, 1, s, ref)
    assert error.tolist() == ref.tolist() == [2 * int(flag != seq)]  # index + 1


def test_bad_arguments(device) -> None:
    with pytest.raises(ValueError, match="index 3"):
        signal(_host(3), 3, torch.tensor([1], device=device))
    with pytest.raises(ValueError, match="int32"):
        signal(_host(3).int(), 0, torch.tensor([1], device=device))


@pytest.mark.parametrize("rows,cols", [(1, 2048), (3, 7168), (16, 2048), (5, 1), (0, 64)])
def test_fetch(rows: int, cols: int, device) -> None:
    src = torch.randn(rows, cols).pin_memory() if device.type == "cuda" \
        else torch.randn(rows, cols)
    dst = torch.full((rows, cols), float("nan"), device=device)
    ref = torch.empty(rows, cols)
    fetch(src, dst)
    fetch_ref(src, ref)
    assert torch.equal(dst.cpu(), ref)


@pytest.mark.parametrize("n,span,placeholders", [(1, 1, [0]), (40, 16, [0, 3, 15]),
                                                 (2100, 1100, [0, 1024, 1099]), (8, 8, []),
                                                 (12, 4, [])])
def test_fetch_takes_carried_ids(n: int, span: int, placeholders: list[int], device) -> None:
    """Negative entries -(j + 1) within the span become carried[j]; the rest are copied,
    negative ones past the span included."""
    g = torch.Generator().manual_seed(n)
    carried = torch.randint(0, 100_000, (max(len(placeholders), 1) + 2,), generator=g)
    src = torch.randint(0, 100_000, (n,), generator=g)
    for j, at in enumerate(placeholders):
        src[at] = -(j + 2)  # any row of carried, not only the first
    if span < n:
        src[span] = -1  # past the span: copied as it is
    if device.type == "cuda":
        src = src.pin_memory()
    dst = torch.full((n,), -7, dtype=torch.int64, device=device)
    ref = torch.empty(n, dtype=torch.int64)
    fetch(src, dst, carried.to(device), span)
    fetch_ref(src, ref, carried, span)
    expected = src.clone()
    for j, at in enumerate(placeholders):
        expected[at] = carried[j + 1]
    assert torch.equal(ref, expected)
    assert torch.equal(dst.cpu(), expected)


def test_fetch_refuses_what_it_cannot_read(device) -> None:
    src = torch.zeros(4).pin_memory() if device.type == "cuda" else torch.zeros(4)
    with pytest.raises(ValueError, match="carried"):  # float rows cannot take ids
        fetch(src, torch.zeros(4, device=device),
              torch.zeros(2, dtype=torch.int64, device=device), 2)
    with pytest.raises(ValueError, match="fetch"):
        fetch(torch.zeros(2, 3), torch.zeros(3, 2, device=device))
    if device.type == "cuda":  # pageable host memory is not the device's to read
        with pytest.raises(ValueError, match="pinned"):
            fetch(torch.zeros(2, 3), torch.zeros(2, 3, device=device))

