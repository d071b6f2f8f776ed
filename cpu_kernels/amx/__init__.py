"""The `fast` MoE on AMX bf16 tiles (Sapphire Rapids and later) for calls with many tokens:
packed weights dequantized to bf16 tiles, f32 sums."""
