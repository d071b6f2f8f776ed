"""The decode attention backends (hybrid/engine/attention/): the choice, its errors, their hooks,
the torch backend against the float64 reference, and flashinfer's page indices.

flashinfer runs on CUDA only: the GPU machine checks its tokens against ours
(scripts/device_rules_check.py) and times both (scripts/bench_mla_peer.py). Here: the choice,
its errors, and the CSR page lists it is planned with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpu_kernels.mla_decode_flashinfer import FlashInferMLADecode, available, csr_pages
from hybrid.engine.attention.select import FLASHINFER_MIN_HEADS, build, resolve
from hybrid.engine.config import EngineConfig
from hybrid.engine.step.forward_batch import ForwardBatch
from hybrid.engine.step.kv_cache import PagedLatentCache
from hybrid.errors import HybridError


def ops(device: str = "cpu", heads: int = 128, dtype=torch.bfloat16, n: int = 3,
        kv_lora: int = 512) -> list:
    return [SimpleNamespace(device=torch.device(device), heads=heads, kv_dtype=dtype,
                            kv_lora=kv_lora, rope=64, index_head_dim=0,
                            uses_gpu_kernels=device != "cpu")
            for _ in range(n)]


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
    from hybrid.engine.attention import flashinfer_decode, select

    def broken(*args, **kwargs):
        raise RuntimeError("nvcc not found")

    monkeypatch.setattr(select, "resolve", lambda choice, ops: "flashinfer")
    monkeypatch.setattr(flashinfer_decode, "FlashInferDecode", broken)
    if choice == "auto":
        assert build(choice, ops("cuda:0"), 64, 8).name == "triton"
        assert "nvcc not found" in caplog.text and "triton" in caplog.text
    else:
        with pytest.raises(HybridError, match="failed to start .*nvcc not found.* triton"):
            build(choice, ops("cuda:0"), 64, 8)


def test_ours_or_torch_need_no_flashinfer():
    assert build("auto", ops("cpu"), 64, 8).name == "torch"
    assert build("triton", ops("cpu"), 64, 8).name == "torch"
    backend = build("triton", ops("cuda:0", heads=16), 64, 8)
    assert (backend.name, backend.heads, backend.capacity) == ("triton", 16, 64 * 8)
    mixed = ops("cuda:0", n=2) + ops("cpu", n=1)  # one backend serves every layer
    assert build("auto", mixed, 64, 8).name == "torch"


def test_triton_splits_follow_the_step_eagerly_and_the_capacity_when_captured():
    from gpu_kernels.mla_decode import choose_splits

    backend = build("triton", ops("cuda:0", heads=16), 16, 64)
    cache = PagedLatentCache(ops("cpu", n=1), 16 * 10)
    fb = ForwardBatch.build([([7], [3, 5], 20, True), ([8], [2], 0, True)], 16, cache,
                            torch.device("cpu"))
    backend.prepare(fb)
    assert fb.attention is backend and fb.attention_plan == choose_splits(2, 16, 21)
    assert fb.on(torch.device("meta")).attention_plan == fb.attention_plan
    backend.prepare_for_capture(fb, 4)
    assert fb.attention_plan == choose_splits(4, 16, 16 * 64)
    prompt = ForwardBatch.build([([1, 2], [9], 0, True)], 16, cache, torch.device("cpu"))
    backend.prepare(prompt)  # no decode rows: nothing to plan
    assert prompt.attention is backend and prompt.attention_plan is None


@pytest.mark.parametrize("seed", range(4))
def test_torch_backend_matches_float64_attention_over_pages(seed):
    """Every decode row against its own keys, gathered page by page in float64."""
    from hybrid.engine.attention.torch_decode import TorchDecode

    g = torch.Generator().manual_seed(seed)
    page, heads, c, r, scale = 4, 3, 8, 4, 0.3
    cache = torch.randn(page * 12 + 1, c + r, generator=g)
    lens = [int(x) for x in torch.randint(1, 3 * page + 1, (3,), generator=g)]
    tables = [torch.randperm(12, generator=g)[:-(-n // page)].tolist() for n in lens]
    chunks = [([1], t, n - 1, True) for t, n in zip(tables, lens)]
    fb = ForwardBatch.build(chunks, page, SimpleNamespace(scratch_slot=page * 12),
                            torch.device("cpu"))
    q_lat, q_rope = torch.randn(3, heads, c, generator=g), torch.randn(3, heads, r, generator=g)
    out = torch.empty(3, heads, c)
    TorchDecode().prepare(fb)
    fb.attention.run(q_lat, q_rope, cache, fb, scale, out)
    for i, (t, n) in enumerate(zip(tables, lens)):
        slots = [t[p // page] * page + p % page for p in range(n)]
        kv = cache[slots].double()  # [n, c + r]
        s = (q_lat[i].double() @ kv[:, :c].T + q_rope[i].double() @ kv[:, c:].T) * scale
        expected = torch.softmax(s, -1) @ kv[:, :c]  # [h, c]
        torch.testing.assert_close(out[i].double(), expected, atol=1e-5, rtol=1e-5)


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


def test_flashinfer_backend_plans_at_start_for_graphs_and_eager_steps(monkeypatch):
    """The engine's glue around flashinfer's wrappers, with a stand-in for them: its kernels
    run once at start-up, each graph bucket gets its own wrapper (made once, with fixed
    buffers, planned before each replay), and an eager step's decodes are planned from their
    pages and lengths."""
    import gpu_kernels.mla_decode_flashinfer as fi
    from hybrid.engine.attention.flashinfer_decode import FlashInferDecode

    monkeypatch.setattr(fi, "FlashInferMLADecode", FakeWrapper)
    op = SimpleNamespace(device=torch.device("cpu"), heads=16, kv_lora=512, rope=64,
                         index_head_dim=0, scale=0.1, kv_dtype=torch.bfloat16)
    backend = FlashInferDecode(op, page_size=16, max_pages=4)
    assert backend.eager.runs == 1 and backend.eager.plans == [([[0]], [1])]
    cache = PagedLatentCache([op], 16 * 10)
    chunks = [([7], [3, 5], 20, True), ([8], [2], 0, True), ([1, 2, 3], [9], 0, True)]
    fb = ForwardBatch.build(chunks, 16, cache, torch.device("cpu"))
    backend.prepare(fb)
    assert fb.attention is backend and fb.attention_plan is backend.eager
    assert backend.eager.plans[-1] == ([[3, 5], [2, 0]], [21, 1])  # from the packed indices
    assert fb.on(torch.device("meta")).attention_plan is backend.eager
    backend.run(None, None, cache, fb, 0.1, None)
    assert backend.eager.runs == 2
    prompt = ForwardBatch.build([([1, 2], [9], 0, True)], 16, cache, torch.device("cpu"))
    backend.prepare(prompt)
    assert prompt.attention_plan is None and len(backend.eager.plans) == 2
    graph = backend.for_graph(4)
    assert backend.for_graph(4) is graph and graph.kwargs["graph_batch"] == 4
    assert graph.kwargs["max_pages"] == 4
    backend.prepare_for_capture(fb, 4)
    assert fb.attention_plan is graph and graph.plans == [([[3, 5], [2, 0]], [21, 1])]
    backend.prepare_for_replay(fb, [[6]], [3])
    assert graph.plans[-1] == ([[6]], [3])
