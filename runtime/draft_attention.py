"""The drafter's attention: every noise-block query sees the cached context keys and all block keys.

Keys arrive gathered in absolute-position order (the draft KV's window, then the noise block), and every
sum runs over them in that order. The result therefore depends only on which positions are visible and
their K/V values, never on where a cache keeps them (ring slot or full row): a ring with cap >= context is
bit-identical to a full cache, and a smaller ring to recomputing its window from scratch.

Visibility: non-causal by default (DFlash); `causal` limits keys to positions <= the query's; a sliding
window keeps |q_pos - k_pos| < window, as z-lab's reference masks it.
"""

import numpy as np
from numba import njit

from ggtools.runtime import workers
from ggtools.runtime.ggmlmath import EXACT
from ggtools.runtime.ops import rms_norm_row, rope_head
from ggtools.runtime.workers import claim, enter, leave

PARALLEL_WORK = 1 << 16   # below this many multiply-adds, splitting over workers costs more than it saves


@njit(**EXACT)
def attention_pairs(q, k, v, q_pos, k_pos, scale, window, causal, out, counter):
    """The (query row, head) pairs, claimed through counter (workers.py). q: (T, n_head, d);
    k, v: (n_keys, n_kv, d) in key order; out: (T, n_head * d)."""
    n_rows, n_head, d = q.shape
    n_keys = k.shape[0]
    group = n_head // k.shape[1]
    enter(counter)
    while True:
        job = claim(counter)
        if job >= n_rows * n_head:
            break
        t, h = job // n_head, job % n_head
        g = h // group
        w = np.empty(n_keys, np.float32)
        m = -np.inf
        for i in range(n_keys):
            if (causal and k_pos[i] > q_pos[t]) or (window > 0 and abs(q_pos[t] - k_pos[i]) >= window):
                w[i] = -np.inf
                continue
            s = np.float32(0.0)
            for j in range(d):
                s += q[t, h, j] * k[i, g, j]
            w[i] = s * scale
            m = max(m, w[i])
        total = np.float32(0.0)
        for i in range(n_keys):
            w[i] = np.exp(w[i] - m) if w[i] != -np.inf else np.float32(0.0)
            total += w[i]
        acc = np.zeros(d, np.float32)
        for i in range(n_keys):
            if w[i] != np.float32(0.0):
                for j in range(d):
                    acc[j] += w[i] * v[i, g, j]
        inv = np.float32(1.0) / total
        for j in range(d):
            out[t, h * d + j] = acc[j] * inv
    leave(counter)


def attention(q, k, v, q_pos, k_pos, scale: float, window: int = 0, causal: bool = False) -> np.ndarray:
    """(T, n_head, d) queries at q_pos over (n_keys, n_kv, d) keys/values at k_pos -> (T, n_head * d)."""
    n_rows, n_head, d = q.shape
    out = np.empty((n_rows, n_head * d), np.float32)
    args = (np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k, np.float32),
            np.ascontiguousarray(v, np.float32), np.asarray(q_pos, np.int64), np.asarray(k_pos, np.int64),
            np.float32(scale), int(window), bool(causal), out)
    if n_rows * n_head * k.shape[0] * d * 2 >= PARALLEL_WORK:
        workers.pool().run(attention_pairs, n_rows * n_head, *args)
    else:
        attention_pairs(*args, np.zeros(2, np.int64))
    return out


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
