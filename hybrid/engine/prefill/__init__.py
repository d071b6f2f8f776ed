"""Long prompts: routed experts streamed to the GPU when that beats the CPU (the cost model
and the stream), and a long chunk's pass spread over several steps beside decodes."""
