"""Decode attention as a backend: how a step's decode rows attend to their KV pages.

One backend serves an engine (`select.build` picks it from `--attention-backend` and the
model's attention operators). The engine prepares each step's ForwardBatch with it before the
forward (`prepare`), a CUDA graph bucket's scratch batch before capture (`prepare_for_capture`)
and that batch again before each replay, from the step's host indices (`prepare_for_replay`);
the attention operators call `fb.attention.run` for the decode rows, whatever the backend.
Prompt chunks are the operator's own (they take another form: ops/mla_attention.py).

    base.py                the interface
    triton_decode.py       ours: gpu_kernels.mla_decode (always there on CUDA)
    flashinfer_decode.py   flashinfer's paged MLA decode (optional)
    torch_decode.py        the same arithmetic in torch (CPU operators)
    select.py              which one runs
"""
