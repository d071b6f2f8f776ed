"""The operators a rule may place, under short names, with the options each one accepts.

An `OperatorSpec` says which modules an operator can replace (by transformers class-name
suffix), which `kwargs` it takes (type, default, allowed values) and how its weights are
stored (for memory planning). `build` (set by the operator's own module) turns the matched
transformers module into the operator; `default` keeps transformers' own implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEVICE_KWARGS = ("generate_device", "prefill_device")
WEIGHT_FORMATS = ("gguf", "bf16", "f16", "f32")


@dataclass(frozen=True)
class Option:
    type: type | tuple[type, ...]
    default: Any
    choices: tuple[Any, ...] | None = None
    help: str = ""


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    summary: str
    applies_to: tuple[str, ...]  # transformers class-name suffixes this operator can replace
    options: dict[str, Option]
    # Modules whose weights stay in the GGUF's own blocks by default ("gguf"); others "f32".
    default_weight_format: str = "gguf"
    build: Callable[..., Any] | None = field(default=None, compare=False)

    def can_replace(self, class_name: str) -> bool:
        return not self.applies_to or class_name.endswith(self.applies_to)

    def resolved(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Options with defaults filled in (kwargs are assumed validated)."""
        return {k: kwargs.get(k, opt.default) for k, opt in self.options.items()}


def _devices(default: str = "cpu") -> dict[str, Option]:
    return {
        "generate_device": Option(str, default, help="where the module runs when decoding"),
        # one copy of an operator's weights serves prompt chunks and decodes alike; a long
        # prompt's CPU-placed experts stream to the GPU on their own (--prefill-experts)
        "prefill_device": Option(str, None, help="where it runs on prompt chunks: its "
                                 "generate_device (the default; a different one is warned of)"),
    }


def _weights(default: str = "gguf") -> dict[str, Option]:
    return {"weight_format": Option(str, default, WEIGHT_FORMATS,
                                    "gguf keeps the file's quant blocks; bf16/f16/f32 dequantize")}


ACTIVATIONS = {"int16": 16, "int8": 8, "fp32": 0}  # x's bits in one-token products


def _product_options() -> dict[str, Option]:
    """How a GPU operator's quantized products take x: one token, and long prompts."""
    return {"activations": Option(
        str, "int16", tuple(ACTIVATIONS),
        "x of one-token products on Q4_K and Q6_K blocks (GPU): int16 or int8 per 32 columns with "
        "integer dot products (relative error ~3e-5 / ~1e-2), or fp32 (exact to rounding)"),
        "prompt_products": Option(
            str, "fp16", ("fp16", "fp32"),
            "products of long prompts' rows (GPU, 256 tokens and more): fp16 operands on "
            "tensor cores with fp32 sums (~5e-4 relative, x's rows scaled into fp16's range), "
            "or fp32 (exact to rounding)")}


_SPECS = [
    OperatorSpec("default", "transformers' own module, moved to a device", (), _devices(),
                 default_weight_format="f32"),
    OperatorSpec("embedding", "token embedding lookup", ("Embedding",), {**_devices(), **_weights()}),
    OperatorSpec("rmsnorm", "RMSNorm", ("RMSNorm",), _devices(), default_weight_format="f32"),
    OperatorSpec("rotary", "YaRN rotary embedding tables", ("RotaryEmbedding",), _devices(),
                 default_weight_format="f32"),
    OperatorSpec("linear", "a linear layer on dequantized or quantized weights", ("Linear",),
                 {**_devices(), **_weights(), **_product_options()}),
    OperatorSpec("grouped_linear", "a block-diagonal linear layer, one block of rows a group "
                 "(DeepSeek-V4's grouped output projection)", ("GroupedLinear",),
                 {**_devices(), **_weights(), **_product_options()}),
    OperatorSpec("hyper_connection", "DeepSeek-V4's hyper-connection: the residual streams' "
                 "collapse, expansion and Sinkhorn mixing weights", ("HyperConnection",),
                 _devices(), default_weight_format="f32"),
    OperatorSpec("lm_head", "the output projection to the vocabulary", ("Linear",),
                 {**_devices(), **_weights(), **_product_options()}),
    OperatorSpec("mla_attention", "MLA attention, absorbed form over a latent KV cache",
                 ("Attention",), {
                     **_devices(), **_weights(), **_product_options(),
                     "kv_cache_dtype": Option(str, "bf16", ("bf16", "f16", "f32"),
                                              "latent KV cache element type"),
                 }),
    OperatorSpec("mlp", "dense MLP or shared experts: down(silu(gate x) * up x)", ("MLP",),
                 {**_devices(), **_weights(), **_product_options()}),
    OperatorSpec("gate", "MoE router: V2 softmax greedy, V3 sigmoid + bias + groups",
                 ("TopkRouter",), _devices(), default_weight_format="f32"),
    OperatorSpec("experts", "routed experts on CPU kernels or torch, per-expert placement",
                 ("Experts",), {
                     **_devices(), **_weights(),
                     "backend": Option(str, "cpu", ("cpu", "torch"),
                                       "cpu: cpu_kernels on GGUF blocks; torch: dequantized"),
                     "mode": Option(str, "exact", ("exact", "fast"), "cpu kernel precision"),
                     "gpu_experts": Option(list, [], help="expert ids kept on gpu_device"),
                     "gpu_device": Option(str, "cuda:0", help="where gpu_experts live"),
                     "gpu_experts_memory": Option(
                         str, "device", ("device", "host"),
                         "where gpu_experts' blocks lie: device (GPU memory) or host "
                         "(page-locked; each step copies the ones it uses over PCIe to "
                         "gpu_device, beside the CPU's cores reading the rest: one staging "
                         "buffer of GPU memory for all layers)"),
                     "pcie_experts": Option((float, int), 0.0, help="a share of each "
                                            "layer's experts (spread over the ids) held as "
                                            "gpu_experts in host memory (gpu_experts_memory "
                                            "host): steps of enough rows copy the ones they use "
                                            "over PCIe and compute them on gpu_device beside "
                                            "the CPU; 0: off"),
                     "defer_experts": Option(int, 0, help="expert deferral: a decoding token's "
                                             "k lowest-weighted experts join the next MoE "
                                             "layer's output, computed while the GPU runs its "
                                             "attention (faster for one or a few streams, slower "
                                             "for many; approximate; CPU experts only: "
                                             "with gpu_experts, among those left on the CPU)"),
                 }),
]
OPERATORS: dict[str, OperatorSpec] = {s.name: s for s in _SPECS}
