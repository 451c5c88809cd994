"""MLA (multi-head latent attention) as kimi-k3 runs it: nope-only (no RoPE anywhere), absorbed, served as MQA
over a cache of the compressed latent, as llama.cpp's CPU backend computes it (build_mla_layer in
src/models/kimi-k3.cpp, build_attn with a K-only cache, flash attention off):

    q       = W_q x,  or W_q_b (rmsnorm(W_q_a x) * q_a_norm)              (T, n_head, nope + rope)
    c, k_pe = W_kv_a x split at kv_lora;  c = rmsnorm(c) * kv_a_norm
    Q_h     = [k_b_h . q_nope_h, q_pe_h]          K = [c, k_pe] (the cache row, rounded to f16)   V = c
    o_h     = v_b_h . softmax(Q_h . K / sqrt(nope + rope)) V             (attention.attention over the cache)
    out     = W_o (o * sigmoid(W_gate x))

k_b and v_b are per-head matrices (ggml mul_mat with the head as the batch dimension). q_nope reaches k_b as a
permuted view: llama.cpp converts it to the weight's vec_dot type first, so its tinyBLAS batch layout applies as
usual except for F32 weights, which keep the input as is and so take vec_dot row by row. V is the cache's first
kv_lora values (a view of K, the same f16 values), transposed for the product with the probabilities.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels import ops
from ggtools.runtime.kernels.ggmlmath import EXACT, to_f16
from ggtools.runtime.target.kimi_k3_pieces import MLATensors
from ggtools.runtime.target.mixers.attention import attention
from ggtools.runtime.weights import MatrixGroup
from gguf import GGMLQuantizationType as T


@njit(**EXACT)
def write_latent(latent, k_pe, k_cache, vt_cache, start, f16):
    """Cache rows start..: K = [latent, k_pe] (f16-rounded for an f16 cache) into k_cache (1, capacity, d), and
    the latent, transposed, into vt_cache (1, d, capacity)'s first rows."""
    n_lora = latent.shape[1]
    for t in range(latent.shape[0]):
        for i in range(k_cache.shape[2]):
            x = latent[t, i] if i < n_lora else k_pe[t, i - n_lora]
            x = to_f16(x) if f16 else x
            k_cache[0, start + t, i] = x
            if i < n_lora:
                vt_cache[0, i, start + t] = x


class MLA(MLATensors):
    def __post_init__(self):
        first = [self.wq_a if self.wq is None else self.wq, self.wkv_a] + ([self.wgate] if self.wgate else [])
        self.inputs = MatrixGroup(*first)
        # the permuted q_nope: F32 weights take it row by row (no tinyBLAS without a contiguous input)
        self.k_b_stepwise = self.wk_b[0].qtype == T.F32

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        n_tokens, n_head, eps = len(h), self.n_head, self.eps
        q, kv_a, *gate = self.inputs(h, stepwise)
        if self.wq is None:
            q = self.wq_b(ops.rms_norm(q, self.q_a_norm, eps), stepwise)
        latent = ops.rms_norm(kv_a[:, :self.kv_lora], self.kv_a_norm, eps)
        heads = q.reshape(n_tokens, n_head, self.q_head)
        query = np.empty((n_tokens, n_head, self.kv_lora + self.rope_dims), np.float32)
        for i in range(n_head):
            query[:, i, :self.kv_lora] = self.wk_b[i](np.ascontiguousarray(heads[:, i, :self.qk_nope]),
                                                      stepwise or self.k_b_stepwise)
        query[:, :, self.kv_lora:] = heads[:, :, self.qk_nope:]
        start = int(positions[0])
        write_latent(latent, np.ascontiguousarray(kv_a[:, self.kv_lora:]), kv.k[slot], kv.v[slot], start, kv.f16)
        mixed = attention(query, kv.k[slot], kv.v[slot], positions, start + n_tokens, hp.attn_scale, kv.f16, stepwise,
                          d_v=self.kv_lora)
        out = np.empty((n_tokens, n_head * self.v_head), np.float32)
        for i in range(n_head):
            out[:, i * self.v_head:(i + 1) * self.v_head] = self.wv_b[i](
                np.ascontiguousarray(mixed[:, i * self.kv_lora:(i + 1) * self.kv_lora]), stepwise)
        if gate:
            ops.sigmoid_rows(gate[0], gate[0])
            out *= gate[0]
        return self.wo(out, stepwise)
