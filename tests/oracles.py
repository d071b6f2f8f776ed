"""The two independent oracles: transformers fed gguf-py's dequantized weights, and llama.cpp.

Neither shares code with our loader: the transformers oracle reads the file with gguf-py's own
`GGUFReader` and `gguf.quants.dequantize`, maps names with its own table below, and loads a
normally constructed transformers model with `load_state_dict(strict=True)`.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from gguf import GGUFReader, quants

from hybrid.model.spec import ModelSpec

_NAMES = {
    "attn_norm": "input_layernorm.weight", "attn_q_a": "self_attn.q_a_proj.weight",
    "attn_q_a_norm": "self_attn.q_a_layernorm.weight", "attn_q_b": "self_attn.q_b_proj.weight",
    "attn_q": "self_attn.q_proj.weight", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm.weight", "attn_kv_b": "self_attn.kv_b_proj.weight",
    "attn_output": "self_attn.o_proj.weight", "ffn_norm": "post_attention_layernorm.weight",
    "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight", "ffn_gate_inp": "mlp.gate.weight",
    "exp_probs_b": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp": "mlp.shared_experts.down_proj.weight",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# deepseek32's lightning indexer: blk.N.indexer.<leaf> (the LayerNorm has a bias too)
_INDEXER_NAMES = {
    "k_norm.weight": "self_attn.indexer.k_norm.weight",
    "k_norm.bias": "self_attn.indexer.k_norm.bias",
    "proj.weight": "self_attn.indexer.weights_proj.weight",
    "attn_k.weight": "self_attn.indexer.wk.weight",
    "attn_q_b.weight": "self_attn.indexer.wq_b.weight",
}


def gguf_py_state_dict(path: str) -> dict[str, torch.Tensor]:
    reader = GGUFReader(path)
    raw: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(reversed([int(x) for x in t.shape]))
        raw[t.name] = quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    sd: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.from_numpy(raw.pop("token_embd.weight").copy()),
        "model.norm.weight": torch.from_numpy(raw.pop("output_norm.weight")),
        "lm_head.weight": torch.from_numpy(raw.pop("output.weight")),
    }
    layers: dict[int, dict[str, np.ndarray]] = {}
    for name, w in raw.items():
        m = re.match(r"blk\.(\d+)\.indexer\.(.+)$", name)
        if m:
            sd[f"model.layers.{m.group(1)}.{_INDEXER_NAMES[m.group(2)]}"] = torch.from_numpy(w)
            continue
        m = re.match(r"blk\.(\d+)\.(\w+)\.(weight|bias)$", name)
        assert m, name
        layers.setdefault(int(m.group(1)), {})[m.group(2)] = w
    for i, ts in layers.items():
        p = f"model.layers.{i}."
        if "attn_k_b" in ts:  # MLA layout: head h's kv_b rows are k_b[h].T then v_b[h]
            k_b, v_b = ts.pop("attn_k_b"), ts.pop("attn_v_b")
            ts["attn_kv_b"] = np.concatenate(
                [np.concatenate([k_b[h].T, v_b[h]], axis=0) for h in range(k_b.shape[0])], axis=0
            )
        if "ffn_gate_exps" in ts:
            gate_up = np.concatenate([ts.pop("ffn_gate_exps"), ts.pop("ffn_up_exps")], axis=1)
            sd[p + "mlp.experts.gate_up_proj"] = torch.from_numpy(gate_up)
        for short, w in ts.items():
            sd[p + _NAMES[short]] = torch.from_numpy(np.ascontiguousarray(w))
    return sd


def transformers_model(spec: ModelSpec, path: str) -> torch.nn.Module:
    from transformers import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, DeepseekV32ForCausalLM

    config = spec.to_hf_config()
    config._attn_implementation = "eager"
    if spec.has_indexer:
        cls = DeepseekV32ForCausalLM
    else:
        cls = DeepseekV3ForCausalLM if spec.is_v3 else DeepseekV2ForCausalLM
    torch.manual_seed(0)
    model = cls(config).eval()
    model.load_state_dict(gguf_py_state_dict(path), strict=True)
    return model


@torch.inference_mode()
def transformers_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[T, V] logits from one full forward (no KV cache)."""
    return model(torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def transformers_greedy(model: torch.nn.Module, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens by full recomputation each step, with their log-probabilities."""
    ids = list(ids)
    out, logprobs = [], []
    for _ in range(n):
        logits = transformers_logits(model, ids)[-1]
        tok = int(torch.argmax(logits))
        logprobs.append(float(torch.log_softmax(logits, -1)[tok]))
        out.append(tok)
        ids.append(tok)
    return out, logprobs


@torch.inference_mode()
def transformers_greedy_cached(model: torch.nn.Module, ids: list[int], n: int
                               ) -> tuple[list[int], list[float]]:
    """transformers_greedy's contract over transformers' own KV cache (the prompt in one
    forward, then one token a forward): far fewer products than recomputing each step."""
    step = model(torch.tensor([ids]), use_cache=True)
    out, logprobs = [], []
    for _ in range(n):
        logits = step.logits[0, -1].float()
        tok = int(torch.argmax(logits))
        logprobs.append(float(torch.log_softmax(logits, -1)[tok]))
        out.append(tok)
        if len(out) < n:
            step = model(torch.tensor([[tok]]), past_key_values=step.past_key_values,
                         use_cache=True)
    return out, logprobs


def llama_cpp_logits(path: str, ids: list[int]) -> np.ndarray:
    """[T, V] logits from llama.cpp with an fp32 KV cache and no flash attention."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=max(64, len(ids) + 8),
                          n_threads=2, verbose=False, type_k=0, type_v=0, flash_attn=False)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def rel_l2(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def routing_margins(model: torch.nn.Module, ids: list[int]) -> np.ndarray:
    """[T] the smallest routing margin of each position over all MoE layers.

    The margin is how far the last chosen expert (and the last chosen group) is ahead of the
    best one left out, in the router's score units. Where it is tiny, an activation error of
    llama.cpp's size can flip the choice, and the logits may then differ by far more than the
    arithmetic error: such positions are routing near-ties, not disagreements.
    """
    margins: list[torch.Tensor] = []

    def hook(module, inputs, _output):
        x = inputs[0].reshape(-1, module.weight.shape[1]).float()
        logits = x @ module.weight.float().T  # [T, E]
        k = module.top_k
        if hasattr(module, "e_score_correction_bias"):  # V3: sigmoid, bias, groups
            s = logits.sigmoid() + module.e_score_correction_bias
            g = module.num_group
            if g > 1:
                gs = s.view(s.shape[0], g, -1).topk(2, dim=-1).values.sum(-1)  # [T, G]
                top = gs.topk(module.topk_group + 1, dim=-1).values
                group_margin = top[:, -2] - top[:, -1]
                keep = gs.topk(module.topk_group, dim=-1).indices
                mask = torch.zeros_like(gs).scatter_(1, keep, 1).repeat_interleave(s.shape[1] // g, 1)
                s = s.masked_fill(mask == 0, float("-inf"))
            else:
                group_margin = torch.full((s.shape[0],), float("inf"))
        else:  # V2: softmax, greedy
            s = logits.softmax(-1)
            group_margin = torch.full((s.shape[0],), float("inf"))
        top = s.topk(k + 1, dim=-1).values
        margins.append(torch.minimum(top[:, k - 1] - top[:, k], group_margin))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if type(m).__name__.endswith("TopkRouter")]
    try:
        with torch.inference_mode():
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return torch.stack(margins).min(dim=0).values.numpy()
