"""The `exact` mode: float32 math on each GGUF block's exactly dequantized weights (row dots per
block family, i-quant decoders), the token grouping by expert, quantized matrix products."""
