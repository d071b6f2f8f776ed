"""What the kernels are built from: explicit SIMD values and intrinsics (AVX2, AVX-512 VNNI),
AMX tile instructions, the cycle counter, and the task queue of numba's parallel loops."""
