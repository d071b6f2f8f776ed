"""The `fast` mode: GGUF blocks repacked at load into row-interleaved tiles (packed.py,
pack_kernels.py), activations quantized per group of 32, integer tiles per block family and
the fused MoE over them (packed_moe.py)."""
