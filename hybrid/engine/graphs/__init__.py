"""Decode steps replayed as CUDA graphs, captured at start-up, one set per batch-size bucket.

    decode_graphs.py  the buckets, their capture and replay (what the model runner calls)
    static_step.py    a bucket's static buffers: the index array its graphs read, pinned staging
    piecewise.py      the "layers" form: a graph per device piece, the CPU experts run between
    whole_step.py     the "step" form: one graph of the whole step, the host drives the experts
    choice.py         which form runs faster here, timed at start-up ("auto")
"""
