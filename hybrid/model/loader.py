"""Build transformers' DeepSeek module tree on the meta device and fill it from a GGUF.

This is the CPU reference model: every later operator (rules, GPU kernels, CPU experts)
replaces modules of this same tree and is checked against it. Weights are dequantized one
tensor at a time and placed straight into their parameters, so peak memory is the model in
`dtype` plus one tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from hybrid.errors import GGUFError
from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec, read_spec
from hybrid.model.spec_v4 import V4Spec
from hybrid.model.tensor_map import check_tensors, load_hf_weight
from hybrid.tokenizer.gguf_tokenizer import GGUFTokenizer

if TYPE_CHECKING:
    from cpu_kernels.runtime.precompile import BackgroundCompile


@dataclass
class LoadedModel:
    spec: ModelSpec
    model: nn.Module  # transformers' DeepseekV3/V2/V32ForCausalLM
    tokenizer: GGUFTokenizer
    gguf: GGUFModelFile
    # fast-mode CPU expert kernels compiled in background processes while it loaded
    # (hybrid/ops/compile_ahead.py): wait for them before the first step
    compiling: list[BackgroundCompile] = field(default_factory=list)


def open_model(path: str) -> tuple[GGUFModelFile, ModelSpec | V4Spec]:
    """Open and validate a GGUF model without loading weights (headers only)."""
    gguf = GGUFModelFile(path)
    spec = read_spec(gguf)
    check_tensors(gguf, spec)
    gguf.check_supported_types()
    return gguf, spec


def build_meta_model(spec: ModelSpec | V4Spec, tokenizer: GGUFTokenizer | None = None) -> nn.Module:
    bos = tokenizer.bos_token_id if tokenizer else None
    eos = tokenizer.eos_token_id if tokenizer else None
    config = spec.to_hf_config(bos_token_id=bos, eos_token_id=eos)
    # V4's attention (a sink per head beside sliding and compressed keys) is eager only
    config._attn_implementation = "eager" if isinstance(spec, V4Spec) else "sdpa"
    cls = causal_lm_class(spec)
    with torch.device("meta"):
        model = cls(config)
    return model.eval()


def causal_lm_class(spec: ModelSpec | V4Spec) -> type[nn.Module]:
    """transformers' model class of the file's architecture and routing."""
    from transformers import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM

    if isinstance(spec, V4Spec):
        from transformers import DeepseekV4ForCausalLM

        return DeepseekV4ForCausalLM
    if spec.has_indexer:
        return DeepseekV32ForCausalLM
    return DeepseekV3ForCausalLM if spec.is_v3 else DeepseekV2ForCausalLM


def load_model(path: str, dtype: torch.dtype = torch.float32,
               progress: Callable[[int, int], None] | None = None) -> LoadedModel:
    """Load the GGUF at `path` into transformers' module tree on CPU, weights in `dtype`."""
    gguf, spec = open_model(path)
    tokenizer = GGUFTokenizer(gguf.metadata)
    model = build_meta_model(spec, tokenizer)
    fill_weights(model, gguf, spec, dtype, progress)
    return LoadedModel(spec, model, tokenizer, gguf)


def fill_weights(model: nn.Module, gguf: GGUFModelFile, spec: ModelSpec, dtype: torch.dtype,
                 progress: Callable[[int, int], None] | None = None,
                 device_of: Callable[[str], str] = lambda module_path: "cpu") -> None:
    """Load every parameter (and routing bias) still on the meta device from the GGUF, one
    tensor at a time, onto `device_of(module path)`; rebuild RoPE tables; tie the output head.

    The reference model fills its whole tree this way; rules injection fills what operators
    did not replace.
    """
    names = [n for n, p in model.named_parameters() if p.is_meta]
    names += [n for n, b in model.named_buffers()
              if b.is_meta and n.endswith(("e_score_correction_bias", "tid2eid"))]
    for done, name in enumerate(names, start=1):
        module_path, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_path)
        tensor = load_hf_weight(gguf, spec, name).to(device_of(module_path))
        if leaf in module._parameters:
            module._parameters[leaf] = nn.Parameter(tensor.to(dtype), requires_grad=False)
        else:
            module._buffers[leaf] = tensor  # the routing bias stays fp32, tid2eid int64
        if progress is not None:
            progress(done, len(names))
    head, embed = model.lm_head, model.model.embed_tokens
    if spec.tied_embeddings and isinstance(head, nn.Linear) and isinstance(embed, nn.Embedding):
        head.weight = embed.weight
    # RoPE tables are computed, not stored: rebuild them off the meta device (the model's,
    # and V4's compressors' and indexers' own)
    for path, module in list(model.named_modules()):
        if path.endswith("rotary_emb") and any(b.is_meta for b in module.buffers()):
            parent, _, leaf = path.rpartition(".")
            setattr(model.get_submodule(parent), leaf,
                    type(module)(config=model.config).to(device_of(path)))
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise GGUFError(f"{gguf.path}: no weights in the file for {', '.join(leftover[:5])}")
