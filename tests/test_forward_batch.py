"""A step's indices, packed on the host and copied once: the prefill chunks' attention index
(one row per chunk, their slots end to end) comes with the same copy and agrees with the spans."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hybrid.engine.step.forward_batch import ForwardBatch


def test_prefill_index_agrees_with_the_spans() -> None:
    page = 4
    chunks = [([5], [0, 1], 6, True),  # a decode at position 6
              ([1, 2, 3], [2, 3], 4, False),  # a chunk after a prefix of 4
              ([7, 8], [4], 0, True)]  # a chunk from the start
    fb = ForwardBatch.build(chunks, page, SimpleNamespace(scratch_slot=99), torch.device("cpu"))
    meta, slots, longest = fb.prefill_index()
    assert longest == 3
    assert meta.tolist() == [[1, 3, 7, 0], [4, 2, 2, 7]]
    for span, (q_start, q_len, kv_len, off) in zip(fb.prefill_spans, meta.tolist()):
        assert (span.q_start, span.q_len, span.kv_len) == (q_start, q_len, kv_len)
        assert torch.equal(slots[off:off + kv_len], span.kv_slots)
    assert slots.tolist() == [8, 9, 10, 11, 12, 13, 14, 16, 17]  # pages 2, 3, then 4
    assert fb.on(torch.device("meta")).prefill_meta.device.type == "meta"


def test_decode_only_steps_have_no_prefill_index() -> None:
    fb = ForwardBatch.build([([5], [0], 2, True)], 4, SimpleNamespace(scratch_slot=99),
                            torch.device("cpu"))
    meta, slots, longest = fb.prefill_index()
    assert meta.shape == (0, 4) and slots.numel() == 0 and longest == 0


def test_warm_up_steps_carry_a_prefill_index_onto_the_scratch_slot() -> None:
    """The model runner's warm-up step goes through the same prefill attention launch as a
    real chunk, so it needs the same index; every slot it names is the scratch slot."""
    fb = ForwardBatch.scratch_prefill(5, 4, SimpleNamespace(scratch_slot=99), torch.device("cpu"))
    meta, slots, longest = fb.prefill_index()
    assert meta.tolist() == [[0, 5, 5, 0]] and longest == 5
    assert slots.tolist() == [99] * 5 and fb.slots.tolist() == [99] * 5
    assert fb.positions.tolist() == list(range(5)) and fb.sample_rows.tolist() == [4]
    span = fb.prefill_spans[0]
    assert (span.q_start, span.q_len, span.kv_len) == (0, 5, 5)


def test_every_field_starts_16_byte_aligned_for_odd_lengths() -> None:
    """Triton compiles a kernel anew for a pointer off 16-byte alignment: every field of the
    packed array, the prefill slots and their index start on an even int64 element."""
    chunks = [([5], [0, 1, 2], 6, True), ([1, 2, 3], [3, 4], 4, False), ([7] * 5, [5, 6], 0, True)]
    fb = ForwardBatch.build(chunks, 4, SimpleNamespace(scratch_slot=99), torch.device("cpu"))
    base = fb.input_ids.data_ptr()
    for name in ("positions", "slots", "seq_lens", "page_table", "sample_rows", "prefill_meta",
                 "prefill_slots"):
        assert (getattr(fb, name).data_ptr() - base) % 16 == 0, name
    assert fb.prefill_meta.tolist() == [[1, 3, 7, 0], [4, 5, 5, 7]]  # the padding moved nothing else
    assert fb.positions.tolist() == [6, 4, 5, 6, 0, 1, 2, 3, 4]
    assert fb.sample_rows.tolist() == [0, 8]
