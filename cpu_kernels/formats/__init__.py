"""GGUF blocks as the kernels read them: the type ids they compute on, weight records, scalar
field readers, the i-quants' grids, random valid blocks for tests, and the float64 references."""
