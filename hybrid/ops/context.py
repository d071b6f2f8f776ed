"""What an operator needs to build itself: the file, the spec, where it sits and its placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hybrid.gguf.reader import GGUFModelFile
from hybrid.model.spec import ModelSpec
from hybrid.ops.weights import Weight

if TYPE_CHECKING:
    from cpu_kernels.runtime.precompile import BackgroundPackers
    from hybrid.model.packed_cache import PackedCache
    from hybrid.ops.device_experts import ExpertStaging


@dataclass(frozen=True)
class BuildContext:
    gguf: GGUFModelFile
    spec: ModelSpec
    path: str  # the replaced module's dotted path
    options: dict[str, Any]  # the placement's resolved kwargs
    module: nn.Module  # the transformers module being replaced (on the meta device)
    packed_cache: PackedCache | None = None  # where fast mode's packed experts persist
    packers: BackgroundPackers | None = None  # fast mode's packers compiling (wait to pack)
    # every layer's host-memory GPU experts share its device buffers (device_experts.py)
    expert_staging: ExpertStaging | None = None

    @property
    def device(self) -> torch.device:
        return torch.device(self.options["generate_device"])

    @property
    def layer_index(self) -> int:
        """N of a module under `model.layers.N`."""
        return int(self.path.split(".")[2])

    @property
    def weight_format(self) -> str:
        return self.options.get("weight_format", "f32")

    def weight(self, leaf: str, fmt: str | None = None) -> Weight:
        """The parameter `<path>.<leaf>` in this operator's format, on its device."""
        name = f"{self.path}.{leaf}" if self.path else leaf
        from hybrid.ops.registry import ACTIVATIONS

        return Weight(self.gguf, self.spec, name, fmt or self.weight_format, str(self.device),
                      ACTIVATIONS[self.options.get("activations", "fp32")],
                      self.options.get("prompt_products", "fp32") == "fp16")
