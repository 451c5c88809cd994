"""kimi-k3's cross-layer residual attention on numba: the mix of the banked layer inputs and the current stream
(res_mix in src/models/kimi-k3.cpp), as llama.cpp's CPU backend computes it:

    score_c = sum(rmsnorm(x_c) * w)         per banked input x_c and for the current stream (ggml_rms_norm, the
                                            mul by w, sum_rows: a float64 sum of the float32 products)
    p       = softmax(scores)               ggml_soft_max (ops.soft_max)
    out     = dsv4_hc_pre(bank, p) + cur * p_cur     the bank's sum a chain of fmas over the inputs in bank order
                                            (GCC contracts `sum += x * w` in ggml_compute_forward_dsv4_hc_pre_f32:
                                            vfmadd231ss in libggml-cpu.so), then the current stream's product added

The layer loop around it (banking every block_size-th layer input, restarting the stream) is
kimi_k3_pieces.ResidualBank's, shared with torch.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels.ggmlmath import EXACT, fma
from ggtools.runtime.kernels.ops import rms_norm_row, soft_max
from ggtools.runtime.model.kimi_k3_pieces import AttnResidualTensors

F32 = np.float32


@njit(**EXACT)
def mix_rows(bank, cur, score, eps, out):
    """bank: (n_ckpt, T, n) banked layer inputs; cur: (T, n) the current stream; score: (n,) -> out (T, n)."""
    n_ckpt, n_tokens, n = bank.shape
    scores = np.empty(n_ckpt + 1, np.float32)
    probs = np.empty(n_ckpt + 1, np.float32)
    normed = np.empty(n, np.float32)
    for t in range(n_tokens):
        for c in range(n_ckpt + 1):
            rms_norm_row(bank[c, t] if c < n_ckpt else cur[t], score, eps, normed)
            total = np.float64(0.0)
            for i in range(n):
                total += np.float64(normed[i])
            scores[c] = np.float32(total)
        soft_max(scores, probs, np.float32(-np.inf))
        for i in range(n):
            acc = F32(0.0)
            for c in range(n_ckpt):
                acc = fma(bank[c, t, i], probs[c], acc)
            out[t, i] = acc + cur[t, i] * probs[n_ckpt]


class AttnResidual(AttnResidualTensors):
    def mix(self, bank: list, cur: np.ndarray, score: np.ndarray) -> np.ndarray:
        """The mix of the banked inputs (a list of (T, n_embd) arrays, oldest first) and cur; cur itself when the
        bank is empty (layer 0's mixer input)."""
        if not bank:
            return cur
        out = np.empty_like(cur)
        mix_rows(np.stack(bank), np.ascontiguousarray(cur), score, F32(self.eps), out)
        return out
