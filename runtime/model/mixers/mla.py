"""MLA (multi-head latent attention) as kimi-k3 runs it: nope-only (no RoPE anywhere), absorbed, served as MQA
over a cache of the compressed latent, as llama.cpp's CPU backend computes it (build_mla_layer in
src/models/kimi-k3.cpp, build_attn with a K-only cache, flash attention off):

    q       = W_q x,  or W_q_b (rmsnorm(W_q_a x) * q_a_norm)              (T, n_head, nope + rope)
    c, k_pe = W_kv_a x split at kv_lora;  c = rmsnorm(c) * kv_a_norm
    Q_h     = [k_b_h . q_nope_h, q_pe_h]          K = [c, k_pe] (the cache row, rounded to f16)   V = c
    o_h     = v_b_h . softmax(Q_h . K / sqrt(nope + rope)) V             (attention.attention over the cache)
    out     = W_o (o * sigmoid(W_gate x))

k_b and v_b are per-head matrices (ggml mul_mat with the head as the batch dimension). Being 3-D, llama.cpp never
repacks them (its CPU_REPACK buffer takes 2-D MUL_MAT weights only), so they are summed in vec_dot / tinyBLAS
order whatever their type. q_nope reaches k_b as a permuted view: llama.cpp converts it to the weight's vec_dot
type first, so its tinyBLAS batch layout applies as usual except for F32 weights, which keep the input as is and
so take vec_dot row by row. Where every row is a one-row dot anyway (one token, stepwise, 32-value block types
whose batch kernel has the one-row shape, F32 k_b), all heads go through one kernel call as a stack. V is the
cache's first kv_lora values (a view of K, the same f16 values), transposed for the product with the
probabilities. A draft tree's rows (tree_batch.py) attend over the latent cache and their own path, laid out as a
one-token step along it has them (attention.tree_attention); nothing else in the layer mixes tokens.
"""

import numpy as np
from numba import njit

from gguf import GGMLQuantizationType as T

from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args
from ggtools.runtime.kernels.ggmlmath import EXACT, to_f16
from ggtools.runtime.model.kimi_k3_pieces import MLATensors
from ggtools.runtime.model.mixers.attention import (attention, attention_rows, one_token_attention_in_caller,
                                                      tree_attention)
from ggtools.runtime.model.pieces import NO_SINKS
from ggtools.runtime.weights import Matrix, MatrixGroup

F32 = np.float32


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


@njit(**EXACT)
def one_token_mla(h, fixed, k_cache, vt_cache, start, f16, positions, scale, q, query, counter):
    """mla_on_token with its fixed arguments (MLA._one_token_args' tuple) as a FixedArgs."""
    return mla_on_token(h, *fixed.args, k_cache, vt_cache, start, f16, positions, scale, q, query, counter)


# wq_b may be None: as an argument (not a field of a FixedArgs) numba prunes the branch it does not take
@njit(**EXACT)
def mla_on_token(h, inputs, where, proj, q_cols, kv_cols, gate_cols, wq_b, q_a_norm, kv_a_norm, eps, k_b, v_b,
                 heads, head_groups, nope, wo, k_cache, vt_cache, start, f16, positions, scale, q, query, counter):
    """MLA.__call__ on one token in one call, with the same kernels in the same order: the input projections
    (matmul.group_rows: q or q_a, kv_a, the gate (gate_cols[0] < 0: none) side by side in proj), q_a's norm and
    q_b (wq_b None: none), kv_a's norm, k_b per head (one plan over the head stack), the cache write, attention
    over the latent cache, v_b per head, the gate's sigmoid product, the output projection. Returns its out. q:
    (1, n_head * (nope + rope)) scratch; query: (1, n_head, kv_lora + rope)."""
    matmul.group_rows(inputs, where, h, counter, proj)
    if wq_b is None:
        q[:] = proj[:, q_cols[0]:q_cols[1]]
    else:
        q_a = np.empty((1, q_a_norm.size), np.float32)
        ops.rms_norm_rows(proj[:, q_cols[0]:q_cols[1]], q_a_norm, eps, q_a)
        q[:] = matmul.plan_rows(wq_b, q_a, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    n_head, kv_lora = heads.size, kv_a_norm.size
    q_head = q.shape[1] // n_head
    latent = np.empty((1, kv_lora), np.float32)
    ops.rms_norm_rows(proj[:, kv_cols[0]:kv_cols[0] + kv_lora], kv_a_norm, eps, latent)
    q_nope = np.empty((n_head, nope), np.float32)
    for j in range(n_head):
        q_nope[j] = q[0, j * q_head:j * q_head + nope]
    absorbed = matmul.plan_rows(k_b, q_nope, False, heads, head_groups, counter)
    for j in range(n_head):
        query[0, j, :kv_lora] = absorbed[j]
        query[0, j, kv_lora:] = q[0, j * q_head + nope:(j + 1) * q_head]
    write_latent(latent, proj[:, kv_cols[0] + kv_lora:kv_cols[1]].copy(), k_cache, vt_cache, start, f16)
    mixed = np.empty((1, n_head * kv_lora), np.float32)
    workers.restart(counter)
    attention_rows(query, k_cache, vt_cache, positions, start + 1, scale, 0, NO_SINKS, True, f16, mixed, counter)
    out = matmul.plan_rows(v_b, mixed.reshape(n_head, kv_lora), False, heads, head_groups, counter).reshape(1, -1)
    if gate_cols[0] >= 0:
        gate = np.empty((1, gate_cols[1] - gate_cols[0]), np.float32)
        ops.sigmoid_rows(proj[:, gate_cols[0]:gate_cols[1]], gate)
        for i in range(out.shape[1]):
            out[0, i] = out[0, i] * gate[0, i]
    return matmul.plan_rows(wo, out, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)


def plain_order(m: Matrix) -> Matrix:
    """m summed as llama.cpp sums a weight it does not repack (vec_dot / tinyBLAS order)."""
    if m.layout.kernel_id != m.layout.type_id:
        m.layout.kernel_id = m.layout.type_id
        m.plan = matmul.MatmulPlan([m.layout], m.buf, [m.offset], m.n_expert)
    return m


def head_stack(slices: list) -> MatrixGroup | None:
    """The per-head matrices as one stack (one kernel call for all heads), when they lie one after the other."""
    first, step = slices[0], slices[0].data.size
    if any(m.buf is not first.buf or m.offset != first.offset + h * step for h, m in enumerate(slices)):
        return None
    return MatrixGroup(plain_order(Matrix(first.name, first.qtype, first.n_rows, first.n_cols, first.buf,
                                          first.offset, len(slices))))


class MLA(MLATensors):
    tree_verify = True

    def __post_init__(self):
        first = [self.wq_a if self.wq is None else self.wq, self.wkv_a] + ([self.wgate] if self.wgate else [])
        self.inputs = MatrixGroup(*first)
        self.wk_b, self.wv_b = [plain_order(m) for m in self.wk_b], [plain_order(m) for m in self.wv_b]
        self.k_b_stack, self.v_b_stack = head_stack(self.wk_b), head_stack(self.wv_b)
        self.heads = np.arange(self.n_head, dtype=np.int64)
        # the permuted q_nope: F32 weights take it row by row (no tinyBLAS without a contiguous input)
        self.k_b_stepwise = self.wk_b[0].qtype == T.F32
        self.one_token = self._one_token_args()
        self.one_token_fixed = None if self.one_token is None else fixed_args(self.one_token)
        self.one_token_call = DirectCall(one_token_mla)

    def _one_token_args(self):
        """one_token_mla's plans, column ranges and norms, where it applies: every plan with one_call, k_b and v_b
        each one head stack; else None."""
        group = self.inputs.one_token_args()
        stacks = [self.k_b_stack, self.v_b_stack]
        if group is None or None in stacks:
            return None
        k_b, v_b = (stack.parts[0][1] for stack in stacks)
        plans = [k_b, v_b, self.wo.plan] + ([self.wq_b.plan] if self.wq is None else [])
        if not all(plan is not None and plan.one_call for plan in plans):
            return None
        (inputs, where), starts = group
        n = self.n_head
        gate_cols = (starts[2], starts[3]) if self.wgate else (-1, -1)
        return (inputs, where, np.empty((1, int(starts[-1])), np.float32), np.array(starts[0:2], np.int64),
                np.array(starts[1:3], np.int64), np.array(gate_cols, np.int64),
                self.wq_b.plan.call_args(1) if self.wq is None else None,
                np.zeros(0, np.float32) if self.q_a_norm is None else self.q_a_norm, self.kv_a_norm, F32(self.eps),
                k_b.call_args(n), v_b.call_args(n), self.heads, np.arange(n + 1, dtype=np.int64), self.qk_nope,
                self.wo.plan.call_args(1))

    def _in_one_call(self, h, positions, kv) -> bool:
        """Whether h (one token, no tree) runs as one_token_mla: the path applies, and the attention would run in this
        thread (workers.run's rule; the matmuls split where worth it: matmul.plan_rows)."""
        return len(h) == 1 and kv.tree is None and self.one_token is not None \
            and one_token_attention_in_caller(self.n_head, int(positions[0]) + 1, self.kv_lora + self.rope_dims)

    def _one_token(self, h, positions, kv, slot: int, hp) -> np.ndarray:
        """__call__ on one token in one kernel call (one_token_mla): the same bits, less the per-call glue."""
        out = self.one_token_call(np.ascontiguousarray(h, np.float32), self.one_token_fixed, kv.k[slot], kv.v[slot],
                                  int(positions[0]), kv.f16, positions, F32(hp.attn_scale),
                                  np.empty((1, self.n_head * self.q_head), np.float32),
                                  np.empty((1, self.n_head, self.kv_lora + self.rope_dims), np.float32),
                                  workers.one_call_counter())
        return out.copy()

    def per_head(self, slices: list, stack, x: np.ndarray, stepwise: bool) -> np.ndarray:
        """x (T, n_head, n_cols) through each head's matrix -> (T, n_head, n_rows)."""
        n_tokens = len(x)
        if stack is not None and (n_tokens == 1 or stepwise or slices[0].layout.block32):
            rows = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(-1, x.shape[2])
            groups = np.arange(0, (self.n_head + 1) * n_tokens, n_tokens, dtype=np.int64)
            (out,) = stack.run_experts(rows, None, self.heads, groups)
            return out.reshape(self.n_head, n_tokens, -1).transpose(1, 0, 2)
        out = np.empty((n_tokens, self.n_head, slices[0].n_rows), np.float32)
        for i in range(self.n_head):
            out[:, i] = slices[i](np.ascontiguousarray(x[:, i]), stepwise)
        return out

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        if self._in_one_call(h, positions, kv):
            return self._one_token(h, positions, kv, slot, hp)
        n_tokens, n_head, eps = len(h), self.n_head, self.eps
        q, kv_a, *gate = self.inputs(h, stepwise)
        if self.wq is None:
            q = self.wq_b(ops.rms_norm(q, self.q_a_norm, eps), stepwise)
        latent = ops.rms_norm(kv_a[:, :self.kv_lora], self.kv_a_norm, eps)
        heads = q.reshape(n_tokens, n_head, self.q_head)
        query = np.empty((n_tokens, n_head, self.kv_lora + self.rope_dims), np.float32)
        query[:, :, :self.kv_lora] = self.per_head(self.wk_b, self.k_b_stack, heads[:, :, :self.qk_nope],
                                                   stepwise or self.k_b_stepwise)
        query[:, :, self.kv_lora:] = heads[:, :, self.qk_nope:]
        start = int(positions[0])
        write_latent(latent, np.ascontiguousarray(kv_a[:, self.kv_lora:]), kv.k[slot], kv.v[slot], start, kv.f16)
        if kv.tree is None:
            mixed = attention(query, kv.k[slot], kv.v[slot], positions, start + n_tokens, hp.attn_scale, kv.f16,
                              stepwise, d_v=self.kv_lora)
        else:
            mixed = tree_attention(query, kv.k[slot], kv.v[slot], kv.tree, hp.attn_scale, kv.f16, stepwise,
                                   d_v=self.kv_lora)
        out = self.per_head(self.wv_b, self.v_b_stack, mixed.reshape(n_tokens, n_head, self.kv_lora),
                            stepwise).reshape(n_tokens, -1)
        if gate:
            ops.sigmoid_rows(gate[0], gate[0])
            out *= gate[0]
        return self.wo(out, stepwise)
