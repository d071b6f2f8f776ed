"""Split GGUFs (hub naming) load from any part or their folder and equal the unsplit file."""

from __future__ import annotations

import pytest
import torch

from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.loader import load_model

PROMPT = [0, 11, 22, 33, 44, 55, 66, 77]


@pytest.mark.parametrize("preset", ["tiny-v3", "tiny-v32"])  # deepseek2, deepseek32
def test_split_equals_unsplit(models, preset) -> None:
    parts = models.files(preset, "q4_k_m", "mla", split=3)
    assert [p.name for p in parts] == [
        f"{preset}-q4_k_m-mla-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    whole = load_model(str(models.path(preset, "q4_k_m", "mla")))
    with torch.inference_mode():
        expected = whole.model(input_ids=torch.tensor([PROMPT])).logits
    for entry in (parts[0], parts[2], parts[0].parent):
        split = load_model(str(entry))
        assert split.gguf.parts == parts
        with torch.inference_mode():
            assert torch.equal(split.model(input_ids=torch.tensor([PROMPT])).logits, expected)


def test_split_metadata_and_tensors(models) -> None:
    split = GGUFModelFile(models.files("tiny-v2-lite", "q8_0", split=2)[0])
    whole = GGUFModelFile(models.path("tiny-v2-lite", "q8_0"))
    assert split.user_metadata() == whole.user_metadata()
    assert split.tensor_names == whole.tensor_names
    assert split.get("split.count") == 2
    for name in ("token_embd.weight", "blk.26.ffn_down_exps.weight"):
        assert bytes(split.tensor(name).data) == bytes(whole.tensor(name).data)
