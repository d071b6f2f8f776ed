"""Which requests run in the next step, and where their tokens sit in the KV cache: plain
Python bookkeeping (no torch, no threads; tests run it with a fake forward)."""
