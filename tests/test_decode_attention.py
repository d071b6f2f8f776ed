"""Choosing the decode attention kernel (ours or flashinfer's) and flashinfer's page indices.

flashinfer runs on CUDA only: the GPU machine checks its tokens against ours
(scripts/device_rules_check.py) and times both (scripts/bench_mla_peer.py). Here: the choice,
its errors, and the CSR page lists it is planned with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpu_kernels.mla_decode_flashinfer import FlashInferMLADecode, available, csr_pages
from hybrid.engine.config import EngineConfig
from hybrid.engine.decode_attention import FLASHINFER_MIN_HEADS, resolve
from hybrid.engine.forward_batch import ForwardBatch
from hybrid.engine.kv_cache import PagedLatentCache
from hybrid.errors import HybridError


def ops(device: str = "cpu", heads: int = 128, dtype=torch.bfloat16, n: int = 3,
        kv_lora: int = 512) -> list:
    return [SimpleNamespace(device=torch.device(device), heads=heads, kv_dtype=dtype,
                            kv_lora=kv_lora, rope=64) for _ in range(n)]


def test_triton_is_always_there():
    assert resolve("triton", ops()) == "triton"
    assert resolve("triton", ops("cuda:0")) == "triton"


def test_auto_takes_ours_where_flashinfer_cannot_run_or_measured_slower():
    assert resolve("auto", ops("cpu")) == "triton"
    assert resolve("auto", ops("cuda:0", dtype=torch.float32)) == "triton"
    assert resolve("auto", ops("cuda:0", kv_lora=128)) == "triton"
    assert resolve("auto", ops("cuda:0", heads=FLASHINFER_MIN_HEADS // 4)) == "triton"
    mixed = ops("cuda:0", n=2) + ops("cuda:1", n=1)
    assert resolve("auto", mixed) == "triton"
    big = ops("cuda:0", heads=FLASHINFER_MIN_HEADS)
    assert resolve("auto", big) == ("flashinfer" if available() else "triton")


@pytest.mark.parametrize("case, words", [
    (ops("cpu"), "CPU"), (ops("cuda:0", dtype=torch.float32), "float32"),
    (ops("cuda:0", kv_lora=256), "512 latent \\+ 64 rope dims .* has 256 \\+ 64"),
    (ops("cuda:0", n=1) + ops("cuda:1", n=1), "several GPUs")])
def test_asking_for_flashinfer_where_it_cannot_run_says_why(case, words):
    with pytest.raises(HybridError, match=words):
        resolve("flashinfer", case)


@pytest.mark.skipif(available(), reason="flashinfer is installed here")
def test_asking_for_flashinfer_without_it_says_how_to_install():
    with pytest.raises(HybridError, match=r"pip install -e \"\.\[flashinfer\]\""):
        resolve("flashinfer", ops("cuda:0"))
    with pytest.raises(ImportError, match="needs flashinfer"):  # the kernel: below hybrid
        FlashInferMLADecode(torch.device("cuda:0"), 16, 512, 64, 64, 0.1)


def test_bad_backend_names_fail_in_the_config():
    with pytest.raises(HybridError, match="attention_backend must be one of"):
        EngineConfig(attention_backend="flash")
    with pytest.raises(HybridError, match="attention_backend"):
        resolve("flash", ops())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_csr_pages_lists_each_sequences_pages_in_order(seed, page_size):
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(1, 9, (1,), generator=g))
    width = int(torch.randint(1, 12, (1,), generator=g))
    table = torch.randint(0, 1000, (b, width), generator=g, dtype=torch.int32)
    lens = torch.randint(1, width * page_size + 1, (b,), generator=g, dtype=torch.int32)
    indptr, indices = csr_pages(table, lens, page_size)
    expected = [table[i, :-(-int(n) // page_size)].tolist() for i, n in enumerate(lens)]
    assert indptr.tolist() == [0, *torch.tensor([len(e) for e in expected]).cumsum(0).tolist()]
    assert indices.tolist() == [p for e in expected for p in e]
    assert indptr.dtype == indices.dtype == torch.int32


def test_csr_pages_refuses_a_length_past_the_table():
    with pytest.raises(ValueError, match="needs more than the page table's 2 pages"):
        csr_pages(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([129]), 64)


@pytest.mark.parametrize("choice", ["auto", "flashinfer"])
def test_flashinfer_failing_to_start_falls_back_under_auto_only(choice, monkeypatch, caplog):
    """Its kernels build at start-up (nvcc); a failed build must not take a server down under
    "auto", and must say what failed when asked for by name."""
    from hybrid.engine import decode_attention

    def broken(*args, **kwargs):
        raise RuntimeError("nvcc not found")

    monkeypatch.setattr(decode_attention, "resolve", lambda choice, ops: "flashinfer")
    monkeypatch.setattr(decode_attention, "FlashInferPlans", broken)
    if choice == "auto":
        assert decode_attention.build(choice, ops("cuda:0"), 64, 8) == ("triton", None)
        assert "nvcc not found" in caplog.text and "triton" in caplog.text
    else:
        with pytest.raises(HybridError, match="failed to start .*nvcc not found.* triton"):
            decode_attention.build(choice, ops("cuda:0"), 64, 8)


def test_ours_needs_no_flashinfer_plans():
    from hybrid.engine.decode_attention import build

    assert build("auto", ops("cpu"), 64, 8) == ("triton", None)
    assert build("triton", ops("cuda:0"), 64, 8) == ("triton", None)


class FakeWrapper:
    """Stands in for FlashInferMLADecode (CUDA only): records its plans and runs."""

    backend = "fake"

    def __init__(self, *args, **kwargs):
        self.kwargs, self.plans, self.runs = kwargs, [], 0

    def plan(self, page_table, seq_lens):
        self.plans.append((torch.as_tensor(page_table).tolist(),
                           torch.as_tensor(seq_lens).tolist()))

    def run(self, q_lat, q_rope, cache, out=None):
        self.runs += 1


def test_flashinfer_plans_build_at_start_and_serve_graphs_and_eager_steps(monkeypatch):
    """The engine's glue around flashinfer's wrappers, with a stand-in for them: its kernels
    run once at start-up, each graph bucket gets its own wrapper (made once, with fixed
    buffers), and an eager step's decodes are planned from their pages and lengths."""
    import gpu_kernels.mla_decode_flashinfer as fi
    from hybrid.engine.decode_attention import FlashInferPlans

    monkeypatch.setattr(fi, "FlashInferMLADecode", FakeWrapper)
    op = SimpleNamespace(device=torch.device("cpu"), heads=16, kv_lora=512, rope=64,
                         scale=0.1, kv_dtype=torch.bfloat16)
    plans = FlashInferPlans(op, page_size=16, max_pages=4)
    assert plans.eager.runs == 1 and plans.eager.plans == [([[0]], [1])]
    graph = plans.for_graph(4)
    assert plans.for_graph(4) is graph and graph.kwargs["graph_batch"] == 4
    assert graph.kwargs["max_pages"] == 4
    cache = PagedLatentCache([op], 16 * 10)
    chunks = [([7], [3, 5], 20, True), ([8], [2], 0, True), ([1, 2, 3], [9], 0, True)]
    fb = ForwardBatch.build(chunks, 16, cache, torch.device("cpu"))
    plans.attach(fb)
    assert fb.decode_attention is plans.eager
    assert plans.eager.plans[-1] == ([[3, 5], [2, 0]], [21, 1])  # from the packed indices
    assert fb.on(torch.device("meta")).decode_attention is plans.eager
    prompt = ForwardBatch.build([([1, 2], [9], 0, True)], 16, cache, torch.device("cpu"))
    plans.attach(prompt)
    assert prompt.decode_attention is None and len(plans.eager.plans) == 2
