"""GPU kernels (Triton) for the parts of DeepSeek that run on the GPU; imports nothing from hybrid.

Each kernel module holds the Triton kernel, the function that launches it into a caller-given or
new output, and a plain torch reference beside it (tests/gpu_kernels compare them over many
shapes; without a GPU they run in Triton's interpreter, TRITON_INTERPRET=1):

- qformat.py, dequant_ref.py, dequant_tile.py: GGUF blocks as planes, their reference and Triton
  dequantization (F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q2_K..Q6_K); dequant_tile.py's
  `embedding` reads rows of a quantized table.
- qmatmul.py: products with quantized weights (decode GEMV to prefill GEMM; per-head groups).
- mla_decode.py: MLA attention of a batch of decodes over the paged latent cache.
- fused.py: RMSNorm with the residual add, RoPE with the latent cache write, SiLU times up.
- router.py: the MoE router's top-k (V2 softmax, V3 sigmoid + bias + groups).
- device_function.py: the decorator of helpers kernels call (triton.jit; under the interpreter
  the plain function, without the interpreter's re-patching on every call).

Modules that define Triton kernels import triton at import time: import them only where a
kernel runs (a CUDA device, or the interpreter).
"""
