"""numba kernels with llama.cpp's CPU numerics: matmuls, the IR vector kernels, scalar ggml arithmetic,
element-wise ops, and the workers that run them in parallel."""
