"""The model's forward over one step: split where work moves between GPU and CPU (decoder.py),
the step's indices (forward_batch.py), the paged latent KV cache, the CPU experts' hand-over
(experts_bridge.py, host_experts.py) and what a step returns."""
