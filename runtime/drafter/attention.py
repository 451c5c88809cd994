"""The drafter's attention: every noise-block query sees the cached context keys and all block keys.

Keys are read from the draft KV's stores through a list of rows in absolute-position order (the visible
context window, then the noise block), and every sum runs over them in that order. The result therefore
depends only on which positions are visible and their K/V values, never on where a cache keeps them (ring
slot or full row): a ring with cap >= context is bit-identical to a full cache, and a smaller ring to
recomputing its window from scratch.

Visibility: non-causal by default (DFlash); `causal` limits keys to positions <= the query's; a sliding
window keeps |q_pos - k_pos| < window, as z-lab's reference masks it.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels import matmul, workers
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.kernels.simd import dot_4x8_2, dot_4x8_main, exp_blocks8
from ggtools.runtime.kernels.ops import rms_norm_row, rope_head
from ggtools.runtime.kernels.workers import claim, enter, leave

U = np.uint64

STORE_TYPE_IDS = {np.dtype(np.float16): matmul.F16, np.dtype(np.float32): matmul.F32}


@njit(**EXACT)
def scores_of_key(row, qg, d, w, i):
    """w[r, i] = row . qg[r] for every query row r: 8-lane accumulators over steps of 32 (reduce4x8), rows
    in pairs sharing the loads of row (four rows' 16 accumulators would not fit the 16 vector registers);
    leftover dims (head_dim not a multiple of 32) added in order."""
    n32 = d // 32 * 32
    r = 0
    if n32:
        while r + 2 <= qg.shape[0]:
            w[r, i], w[r + 1, i] = dot_4x8_2(row, qg, r, n32)
            r += 2
        for r in range(r, qg.shape[0]):
            w[r, i] = dot_4x8_main(row, qg, r, n32)
    else:
        w[:, i] = 0.0
    for r in range(qg.shape[0]):
        for j in range(n32, d):
            w[r, i] += row[j] * qg[r, j]


@njit(**EXACT)
def attention_groups(q, k_store, v_store, store_type, n_kv, slots, k_pos, q_pos, scale, window, causal, out,
                     counter):
    """One task per KV head g (claimed through counter, workers.py): its query heads' rows attend over the
    keys stored at rows `slots` (in that order) of k_store / v_store, raw bytes of (rows, n_kv, d) values of
    ggml type store_type (F16 or F32). Each key and value row is decoded once per task. Softmax: ggml's
    vector expf in blocks of 8 keys, block sums added in float64. q: (T, n_head, d); out: (T, n_head * d)."""
    n_rows, n_head, d = q.shape
    group = n_head // n_kv
    n_keys = slots.size
    n_pad = (n_keys + 7) // 8 * 8
    row_bytes = U(d) * (U(2) if store_type == matmul.F16 else U(4))
    enter(counter)
    while True:
        g = claim(counter)
        if g >= n_kv:
            break
        n_q = n_rows * group
        qg = np.empty((n_q, d), np.float32)
        for r in range(n_q):
            qg[r] = q[r // group, g * group + r % group]
        w = np.full((n_q, n_pad), -np.inf, np.float32)
        row = np.empty(d, np.float32)
        for i in range(n_keys):
            matmul.decode_row(store_type, k_store, (U(slots[i]) * U(n_kv) + U(g)) * row_bytes, row, U(1), U(1))
            scores_of_key(row, qg, d, w, i)
        e = np.empty((n_q, n_pad), np.float32)
        total = np.empty(n_q, np.float32)
        for r in range(n_q):
            qp = q_pos[r // group]
            m = -np.inf
            for i in range(n_keys):
                if (causal and k_pos[i] > qp) or (window > 0 and abs(qp - k_pos[i]) >= window):
                    w[r, i] = -np.inf
                else:
                    w[r, i] *= scale
                    m = max(m, w[r, i])
            total[r] = np.float32(exp_blocks8(w[r], np.float32(m), e[r]))
        acc = np.zeros((n_q, d), np.float32)
        for i in range(n_keys):
            matmul.decode_row(store_type, v_store, (U(slots[i]) * U(n_kv) + U(g)) * row_bytes, row, U(1), U(1))
            for r in range(n_q):
                p = e[r, i]
                if p != np.float32(0.0):
                    for j in range(d):
                        acc[r, j] += p * row[j]
        for r in range(n_q):
            inv = np.float32(1.0) / total[r]
            h = g * group + r % group
            for j in range(d):
                out[r // group, h * d + j] = acc[r, j] * inv
    leave(counter)


def attention(q, k_store, v_store, slots, k_pos, q_pos, scale: float, window: int = 0,
              causal: bool = False) -> np.ndarray:
    """(T, n_head, d) queries at q_pos over the keys at rows `slots` of the (rows, n_kv, d) stores
    (positions k_pos) -> (T, n_head * d)."""
    n_rows, n_head, d = q.shape
    n_kv = k_store.shape[1]
    out = np.empty((n_rows, n_head * d), np.float32)
    args = (np.ascontiguousarray(q, np.float32), _bytes(k_store), _bytes(v_store), STORE_TYPE_IDS[k_store.dtype],
            n_kv, np.asarray(slots, np.int64), np.asarray(k_pos, np.int64), np.asarray(q_pos, np.int64),
            np.float32(scale), int(window), bool(causal), out)
    workers.run(attention_groups, n_kv, n_rows * n_head * len(slots) * d * 2, workers.ATTENTION_MIN_WORK, *args)
    return out


def _bytes(store: np.ndarray) -> np.ndarray:
    return store.reshape(-1).view(np.uint8)


@njit(**EXACT)
def norm_rope_rows(x, norm, eps, cos, sin, neox, out):
    """Per head: RMS norm (skipped when norm is empty), then RoPE. x: (T, heads * d); out: (T, heads, d)."""
    n_rows, n_heads, d = out.shape
    head = np.empty(d, np.float32)
    for t in range(n_rows):
        for h in range(n_heads):
            src = x[t, h * d:(h + 1) * d]
            if norm.size:
                rms_norm_row(src, norm, eps, head)
            else:
                head[:] = src
            rope_head(head, cos[t], sin[t], neox)
            out[t, h] = head


def norm_rope(x: np.ndarray, n_heads: int, norm: np.ndarray, eps: float, rope) -> np.ndarray:
    """q or k projections (T, heads * d) -> per-head normed, rotated (T, heads, d); rope = (cos, sin)."""
    out = np.empty((x.shape[0], n_heads, x.shape[1] // n_heads), np.float32)
    norm_rope_rows(np.ascontiguousarray(x, np.float32), norm, np.float32(eps), rope[0], rope[1], True, out)
    return out
