"""Causal GQA attention over the KV cache, as llama.cpp's CPU backend computes it without flash
attention (its default in llama-cpp-python), operation for operation. With an f16 cache (llama.cpp's
default; an f32 cache skips the f16 roundings):

    scores = K . f16(q)              mul_mat(k, q): q rounded to f16, dots with fma lanes
    w      = scores * scale + mask   soft_max_ext: masked positions -inf (future ones; with a sliding
                                     window of n, also those n or more positions back)
    e      = ggml_v_expf(w - max)    in blocks of 8, each block's hsum8 added in float64
    p      = f16(e * (1 / sum))      mul_mat(v, kq) rounds the probabilities to f16
    out    = V^T . p

Attention sinks (gpt-oss; soft_max_add_sinks): one more logit per head, taking part in the max and, as
libm expf(sink - max), in the sum, but not in the output.

One-row batches use ggml_vec_dot's layout, longer ones tinyBLAS's, as llama.cpp picks them: tinyBLAS
only takes contiguous inputs of a matching type, and the permuted queries qualify only once
converted to f16, so with an f32 cache the scores always use vec_dot. The cache length is padded to a multiple of 32 with zero rows, as llama.cpp pads n_kv, which leaves
the values unchanged but fixes which lane each position lands in.

A draft tree's rows (tree_batch.py) each attend over the cache and their own path, with the path's keys and values
laid out where a one-token step along it has them (tree_attention_rows): the same sums in the same lanes.
"""

import numpy as np
from numba import carray, cfunc, njit, types

from ggtools.quants.floatbits import f32_bits, f32_from_bits
from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import FixedArgs, fixed_args
from ggtools.runtime.kernels.workers import (ARGS, CFUNC, CONTROL_SIZE, ENTRY_SIGNATURE, Job, array_1d, array_2d,
                                             array_3d, claim, close_job, enter, leave, publish, put_array)
from ggtools.runtime.kernels.ggmlmath import EXACT, to_f16, to_f16_row
from ggtools.runtime.kernels.matmul import dot_one_row
from ggtools.runtime.kernels.ops import rms_norm_row, rope_head, soft_max
from ggtools.runtime.kernels.simd import dot_rows_4x8, dot_rows_lanes8
from ggtools.runtime.model.pieces import NO_SINKS, AttentionTensors
from ggtools.runtime.weights import MatrixGroup

KV_PAD = 32
NO_BIAS = np.zeros(0, np.float32)


@njit(**EXACT)
def dots(w, x, n_rows, one_row, f16, out):
    """out[r] = w . x[r] for r < n_rows, in ggml_vec_dot_f16/f32's layout (one_row) or tinyBLAS's."""
    if one_row and w.size % 32:     # rows with a leftover part: ggml's tail loop, row by row
        for r in range(n_rows):
            out[r] = dot_one_row(w, x, r, f16)
    elif one_row:
        dot_rows_4x8(w, x, n_rows, out)
    else:
        dot_rows_lanes8(w, x, n_rows, out)


@njit(**EXACT)
def attention_rows(q, k_cache, vt_cache, q_positions, n_ctx, scale, window, sinks, one_row, f16, out, counter):
    """The T * n_head (token, head) pairs, claimed through counter (workers.py). q: (T, n_head, d)
    after RoPE; k_cache: (n_kv, capacity, d), vt_cache: (n_kv, d, capacity) (f16-valued when f16);
    window: a query sees the last `window` positions (0: all); sinks: per head (empty: none);
    out: (T, n_head * d_v), each head the first d_v rows of vt_cache (d_v = d but for MLA's latent)."""
    n_tokens, n_head, d = q.shape
    d_v = out.shape[1] // n_head
    group = n_head // k_cache.shape[0]
    n_pad = (n_ctx + KV_PAD - 1) // KV_PAD * KV_PAD
    q16, w, p = np.empty(d, np.float32), np.empty(n_pad, np.float32), np.empty(n_pad, np.float32)
    enter(counter)
    while True:
        job = claim(counter)
        if job >= n_tokens * n_head:
            break
        t, h = job // n_head, job % n_head
        g = h // group
        query_operand(q[t, h], f16, q16)
        dots(q16, k_cache[g], n_pad, one_row or not f16, f16, w)
        attend_scores(w, p, vt_cache[g], q_positions[t], scale, window,
                      sinks[h] if sinks.size else np.float32(-np.inf), one_row, f16, out[t, h * d_v:(h + 1) * d_v])
    leave(counter)


@njit(**EXACT)
def query_operand(q_row, f16, q16):
    """q16 = the query as mul_mat(k, q) reads it: rounded to f16 over an f16 cache."""
    if f16:
        to_f16_row(q_row, q16)
    else:
        q16[:] = q_row


@njit(**EXACT)
def attend_scores(w, p, vt, q_position, scale, window, sink, one_row, f16, out):
    """One (token, head) from its raw scores w over key positions 0..w.size-1 (a multiple of KV_PAD): scaled, keys
    after q_position (and with a window, `window` or more back) masked, softmax with the sink into p (scratch of
    w's size), then the sum of the values vt (d, >= w.size) weighted by it -> out (d)."""
    n_pad = w.size
    lo = q_position - window + 1 if window else 0
    for s in range(n_pad):
        w[s] = w[s] * scale if lo <= s <= q_position else -np.inf
    soft_max(w, p, sink)
    if f16:      # mul_mat(v, kq) rounds the probabilities to f16
        to_f16_row(p, p)
    dots(p, vt, out.size, one_row, f16, out)


@njit(**EXACT)
def attention_rows_post(control, entry, q, k_cache, vt_cache, q_positions, n_ctx, scale, window, sinks, one_row, f16,
                        out):
    """attention_rows on the workers' fast path (workers.py; contiguous arrays)."""
    control[ARGS], control[ARGS + 1], control[ARGS + 2] = n_ctx, np.int64(f32_bits(scale)), window
    control[ARGS + 3], control[ARGS + 4] = one_row, f16
    i = put_array(control, put_array(control, put_array(control, ARGS + 5, q), k_cache), vt_cache)
    i = put_array(control, put_array(control, put_array(control, i, q_positions), sinks), out)
    publish(control, entry)
    attention_rows(q, k_cache, vt_cache, q_positions, n_ctx, scale, window, sinks, one_row, f16, out, control[0:2])
    close_job(control)


@cfunc(ENTRY_SIGNATURE, **CFUNC)
def attention_rows_entry(address):
    control = carray(address, (CONTROL_SIZE,))
    n_ctx, scale, window = control[ARGS], f32_from_bits(control[ARGS + 1]), control[ARGS + 2]
    one_row, f16 = control[ARGS + 3] != 0, control[ARGS + 4] != 0
    q, i = array_3d(control, ARGS + 5, np.float32)
    k_cache, i = array_3d(control, i, np.float32)
    vt_cache, i = array_3d(control, i, np.float32)
    q_positions, i = array_1d(control, i, np.int64)
    sinks, i = array_1d(control, i, np.float32)
    out, i = array_2d(control, i, np.float32)
    attention_rows(q, k_cache, vt_cache, q_positions, n_ctx, scale, window, sinks, one_row, f16, out, control[0:2])


ATTENTION_ROWS = Job(attention_rows, attention_rows_post, attention_rows_entry)


TREE_ROWS_PER_TASK = 8


@njit(**EXACT)
def tree_attention_rows(q, k_cache, vt_cache, start, paths, depths, scale, window, sinks, one_row, f16, out, counter):
    """A tree batch (tree_batch.py): row t at position start + depths[t] attends over cache positions 0..start-1
    and then its path's rows (cache rows start + paths[t, j], j <= depths[t]), laid out at positions start,
    start + 1, ... as a one-token step along the path has them, so every sum runs in that step's order (padding
    rows are zero: masked, they weigh nothing). Tasks: (kv head, block of TREE_ROWS_PER_TASK rows), each with its
    own copy of the values in that layout (its first d_v rows: out is (T, n_head * d_v))."""
    n_tokens, n_head, d = q.shape
    d_v = out.shape[1] // n_head
    n_kv = k_cache.shape[0]
    group = n_head // n_kv
    n_blocks = (n_tokens + TREE_ROWS_PER_TASK - 1) // TREE_ROWS_PER_TASK
    width = (start + depths.max() + 1 + KV_PAD - 1) // KV_PAD * KV_PAD
    q16, scores, p = np.empty(d, np.float32), np.empty(width, np.float32), np.empty(width, np.float32)
    enter(counter)
    while True:
        job = claim(counter)
        if job >= n_kv * n_blocks:
            break
        g, block = job // n_blocks, job % n_blocks
        vt = np.empty((d_v, width), np.float32)
        vt[:, :start] = vt_cache[g, :d_v, :start]
        for t in range(block * TREE_ROWS_PER_TASK, min(n_tokens, (block + 1) * TREE_ROWS_PER_TASK)):
            depth = depths[t]
            n_pad = (start + depth + 1 + KV_PAD - 1) // KV_PAD * KV_PAD
            vt[:, start:n_pad] = 0.0
            for j in range(depth + 1):
                vt[:, start + j] = vt_cache[g, :d_v, start + paths[t, j]]
            for h in range(g * group, (g + 1) * group):
                query_operand(q[t, h], f16, q16)
                w = scores[:n_pad]
                w[:] = 0.0
                dots(q16, k_cache[g], start, one_row or not f16, f16, w)
                for j in range(depth + 1):
                    row = start + paths[t, j]
                    dots(q16, k_cache[g, row:row + 1], 1, one_row or not f16, f16, w[start + j:start + j + 1])
                attend_scores(w, p[:n_pad], vt, start + depth, scale, window,
                              sinks[h] if sinks.size else np.float32(-np.inf), one_row, f16,
                              out[t, h * d_v:(h + 1) * d_v])
    leave(counter)


# one compiled version: q, k and v come as column views of a projection (numba's one-token path, batches) or as
# whole arrays, and each combination of layouts compiled its own
PROJECTION, VECTOR, TABLE = types.float32[:, :], types.float32[::1], types.float32[:, ::1]
CACHE = types.float32[:, :, ::1]


@njit([(PROJECTION, PROJECTION, PROJECTION, VECTOR, VECTOR, VECTOR, VECTOR, VECTOR, types.float32, TABLE, TABLE,
        types.boolean, CACHE, CACHE, types.int64, types.boolean, CACHE)], **EXACT)
def prepare_attention(q, k, v, bq, bk, bv, q_norm, k_norm, eps, cos, sin, neox, k_cache, vt_cache, start, f16, q_out):
    """One layer's new tokens: the projections' biases (bq, bk, bv; empty: none), per-head
    RMS norm of q and k (qwen3; skipped when the norms are empty), RoPE, and the cache write of k and v
    (rounded to f16 for an f16 cache) at positions start... q, k, v: (T, heads * d) projections;
    q_out: (T, n_head, d)."""
    n_tokens, n_head, d = q_out.shape
    n_kv = k_cache.shape[0]
    head = np.empty(d, np.float32)
    for t in range(n_tokens):
        for h in range(n_head + n_kv):
            o = h * d if h < n_head else (h - n_head) * d
            src = q[t, o:o + d] if h < n_head else k[t, o:o + d]
            bias = bq if h < n_head else bk
            for i in range(d):
                head[i] = src[i] + bias[o + i] if bias.size else src[i]
            norm = q_norm if h < n_head else k_norm
            if norm.size:
                rms_norm_row(head, norm, eps, head)
            rope_head(head, cos[t], sin[t], neox)
            if h < n_head:
                q_out[t, h] = head
            else:
                for i in range(d):
                    k_cache[h - n_head, start + t, i] = to_f16(head[i]) if f16 else head[i]
        for g in range(n_kv):
            for i in range(d):
                value = v[t, g * d + i] + bv[g * d + i] if bv.size else v[t, g * d + i]
                vt_cache[g, i, start + t] = to_f16(value) if f16 else value


@njit(**EXACT)
def one_token_attention(x, norm, eps, fixed, cos, sin, k_cache, vt_cache, start, f16, positions, counter, x_out):
    """x_out = x + Attention.__call__(rms_norm(x) * norm) on one token in one call, with the same kernels in the same
    order: the norm, Q, K and V (their group's plans, into proj's columns), prepare_attention, attention_rows, with
    output_gate the product with sigmoid(gate), the output projection, its bias (empty: none), the residual. qkv:
    MatrixGroup.one_token_args' (plans, where); wo: MatmulPlan.call_args for one row; q, gate: (1, n_head * d)
    scratch for the queries and gates of a gated Q projection; fixed: Attention._fixed_one_token_args' FixedArgs."""
    (h, qkv, q_cols, k_cols, v_cols, bq, bk, bv, q_norm, k_norm, neox, scale, window, sinks, output_gate, wo, bo, proj,
     q, gate, roped, attended, experts, groups) = fixed.args
    ops.rms_norm_rows(x, norm, eps, h)
    matmul.group_rows(qkv[0], qkv[1], h, counter, proj)
    if output_gate:         # each head's query then its gate
        d = roped.shape[2]
        for j in range(roped.shape[1]):
            o = q_cols[0] + 2 * j * d
            q[0, j * d:(j + 1) * d] = proj[0, o:o + d]
            gate[0, j * d:(j + 1) * d] = proj[0, o + d:o + 2 * d]
    else:
        q = proj[:, q_cols[0]:q_cols[1]]
    prepare_attention(q, proj[:, k_cols[0]:k_cols[1]], proj[:, v_cols[0]:v_cols[1]], bq, bk, bv, q_norm, k_norm, eps,
                      cos, sin, neox, k_cache, vt_cache, start, f16, roped)
    workers.restart(counter)
    attention_rows(roped, k_cache, vt_cache, positions, start + 1, scale, window, sinks, True, f16, attended, counter)
    if output_gate:
        ops.sigmoid_rows(gate, gate)
        for i in range(attended.shape[1]):
            attended[0, i] = attended[0, i] * gate[0, i]
    out = matmul.plan_rows(wo, attended, False, experts, groups, counter)
    for i in range(x.shape[1]):
        x_out[0, i] = (out[0, i] + bo[i] if bo.size else out[0, i]) + x[0, i]


def attention_work(n_tokens: int, n_head: int, n_ctx: int, d: int) -> int:
    """Multiply-adds of n_tokens queries of n_head heads over n_ctx positions of size d (workers.run's measure)."""
    return n_tokens * n_head * n_ctx * d * 2


def one_token_attention_in_caller(n_head: int, n_ctx: int, d: int) -> bool:
    """Whether one token's attention runs in the calling thread (workers.run's rule), as the one-call paths run it
    (their matmuls split where worth it: matmul.plan_rows)."""
    return workers.in_caller(n_head, attention_work(1, n_head, n_ctx, d), workers.ATTENTION_MIN_WORK)


def attention(q: np.ndarray, k_cache: np.ndarray, vt_cache: np.ndarray, q_positions: np.ndarray,
              n_ctx: int, scale: float, f16: bool = True, stepwise: bool = False, window: int = 0,
              sinks: np.ndarray = NO_SINKS, d_v: int | None = None) -> np.ndarray:
    """(T, n_head, d) queries at q_positions over cache positions 0..n_ctx-1 -> (T, n_head * d_v); d_v: the values'
    size (default d; MLA's latent: the first d_v rows of vt_cache)."""
    n_tokens, n_head, d = q.shape
    out = np.empty((n_tokens, n_head * (d_v or d)), np.float32)
    one_row = n_tokens == 1 or stepwise
    args = (np.ascontiguousarray(q, np.float32), k_cache, vt_cache, np.ascontiguousarray(q_positions, np.int64),
            n_ctx, np.float32(scale), window, sinks, one_row, f16, out)
    workers.run_any(ATTENTION_ROWS, n_tokens * n_head, attention_work(n_tokens, n_head, n_ctx, d),
                    workers.ATTENTION_MIN_WORK, *args)
    return out


def tree_attention(q: np.ndarray, k_cache: np.ndarray, vt_cache: np.ndarray, tree, scale: float, f16: bool = True,
                   stepwise: bool = False, window: int = 0, sinks: np.ndarray = NO_SINKS,
                   d_v: int | None = None) -> np.ndarray:
    """(T, n_head, d) queries of a tree batch (tree_batch.TreeBatch, its rows' K/V in the cache at tree.start + row)
    -> (T, n_head * d_v) (d_v as in `attention`)."""
    n_tokens, n_head, d = q.shape
    out = np.empty((n_tokens, n_head * (d_v or d)), np.float32)
    n_blocks = -(-n_tokens // TREE_ROWS_PER_TASK)
    work = attention_work(n_tokens, n_head, tree.start + int(tree.depths.max()) + 1, d)
    workers.run(tree_attention_rows, k_cache.shape[0] * n_blocks, work, workers.ATTENTION_MIN_WORK,
                np.ascontiguousarray(q, np.float32), k_cache, vt_cache, tree.start, tree.paths, tree.depths,
                np.float32(scale), window, sinks, n_tokens == 1 or stepwise, f16, out)
    return out


class Attention(AttentionTensors):
    """The attention mixer on numba: Q, K, V projections (one kernel call), biases, per-head q/k norms and RoPE
    with the cache write (prepare_attention), causal attention over the cache (optionally a sliding window,
    and gpt-oss's sinks), the output projection (optional bias). With output_gate (qwen35) the attention
    output is multiplied by sigmoid(gate) before the output projection. Runs tree batches (kv.tree)."""

    tree_verify = True

    def __post_init__(self):
        self.qkv = MatrixGroup(self.wq, self.wk, self.wv)
        self.biases = tuple(NO_BIAS if b is None else b for b in (self.bq, self.bk, self.bv))
        self.out_bias = NO_BIAS if self.bo is None else self.bo
        self.one_token = self._one_token_args()
        self.one_token_fixed = None      # made by the first one-token call, which knows the head shapes
        self.one_token_call = DirectCall(one_token_attention)

    def _one_token_args(self):
        """one_token_attention's projections (Q, K and V as MatrixGroup.one_token_args, the output projection's
        MatmulPlan.call_args) and Q's, K's and V's column ranges, where every plan has one_call; else None."""
        group = self.qkv.one_token_args()
        if group is None or self.wo.plan is None or not self.wo.plan.one_call:
            return None
        qkv, starts = group
        columns = [np.array(starts[i:i + 2], np.int64) for i in (0, 1, 2)]
        return qkv, columns, self.wo.plan.call_args(1), int(starts[-1])

    def _fixed_one_token_args(self, hp) -> FixedArgs:
        """one_token_attention's arguments that stay from call to call: plans, biases, norms, the model's attention
        settings, and scratch (h, proj, q, gate, roped, attended: written anew by every call)."""
        qkv, (q_cols, k_cols, v_cols), wo, n_proj = self.one_token
        h, proj = np.empty((1, hp.n_embd), np.float32), np.empty((1, n_proj), np.float32)
        q, gate, attended = np.empty((3, 1, hp.n_head * hp.head_dim), np.float32)
        roped = np.empty((1, hp.n_head, hp.head_dim), np.float32)
        return fixed_args((h, qkv, q_cols, k_cols, v_cols, *self.biases, self.q_norm, self.k_norm, hp.rope_neox,
                           np.float32(hp.attn_scale), self.window, self.sinks, self.output_gate, wo, self.out_bias,
                           proj, q, gate, roped, attended, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP))

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        n_tokens = h.shape[0]
        q, k, v = self.qkv(h, stepwise)
        if self.output_gate:
            heads = q.reshape(n_tokens, hp.n_head, 2, hp.head_dim)
            q, gate = (np.ascontiguousarray(heads[:, :, j]).reshape(n_tokens, -1) for j in (0, 1))
        start = int(positions[0])
        roped = np.empty((n_tokens, hp.n_head, hp.head_dim), np.float32)
        prepare_attention(q, k, v, *self.biases, self.q_norm, self.k_norm, np.float32(hp.rms_eps), *rope,
                          hp.rope_neox, kv.k[slot], kv.v[slot], start, kv.f16, roped)
        if kv.tree is None:
            out = attention(roped, kv.k[slot], kv.v[slot], positions, start + n_tokens, hp.attn_scale, kv.f16,
                            stepwise, self.window, self.sinks)
        else:
            out = tree_attention(roped, kv.k[slot], kv.v[slot], kv.tree, hp.attn_scale, kv.f16, stepwise, self.window,
                                 self.sinks)
        if self.output_gate:
            ops.sigmoid_rows(gate, gate)
            out *= gate
        out = self.wo(out, stepwise)
        if self.bo is not None:
            out += self.bo
        return out

    def with_residual(self, ops, x, norm, eps, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        if len(x) == 1 and kv.tree is None and self.one_token is not None \
                and one_token_attention_in_caller(hp.n_head, int(positions[0]) + 1, hp.head_dim):
            return self._one_token(x, norm, eps, positions, rope, kv, slot, hp)
        return super().with_residual(ops, x, norm, eps, positions, rope, kv, slot, hp, stepwise)

    def _one_token(self, x, norm, eps, positions, rope, kv, slot: int, hp) -> np.ndarray:
        """with_residual on one token in one kernel call (one_token_attention): the same bits, less the per-call
        glue."""
        if self.one_token_fixed is None:
            self.one_token_fixed = self._fixed_one_token_args(hp)
        x_out = np.empty((1, hp.n_embd), np.float32)
        self.one_token_call(x, norm, np.float32(eps), self.one_token_fixed, *rope, kv.k[slot], kv.v[slot],
                            int(positions[0]), kv.f16, positions, workers.one_call_counter(), x_out)
        return x_out
