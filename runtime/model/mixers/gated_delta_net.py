"""Gated DeltaNet: the linear-attention mixer of qwen35 / qwen35moe, as llama.cpp's CPU backend runs it
(src/models/qwen35.cpp with the fused ggml_gated_delta_net op, llama.cpp's default on the CPU).

Per token, with C = 2 * key_dim + value_dim conv channels:

    qkv   = W_qkv x                      z = W_gate x                   (matmuls)
    beta  = sigmoid(W_beta x)            g = softplus(W_alpha x + dt) * a      (a = -exp(A_log), per v-head)
    c     = silu(causal depthwise conv over the last K qkv rows)  (the K - 1 earlier rows are the conv state)
    q, k  = l2norm per head of c[:key_dim], c[key_dim:2 key_dim];  v = c[2 key_dim:]
    per v-head h (q/k head h % n_k_heads: the converter stores v heads tiled):
        S   = exp(g) S;   d = (v - S^T k) beta;   S += k d^T;   o = S^T q / sqrt(head_dim)
    out   = W_out (rmsnorm(o) * norm * silu(z))    per v-head

Operation order and roundings are ggml's: l2norm is rms_norm(eps / n) then a scale by 1 / sqrt(n); the
conv sum is a float chain of separately rounded products and sums (ggml's build does not contract it); S is
stored transposed (row j is column j of S), so both S^T k and S^T q are ggml_vec_dot_f32 dots and the update
is ggml_vec_mad_f32 (fma); sigmoid, softplus and exp use libm.
The recurrence is per token whatever the batch, so a verify batch gives the same bits as one-token steps.
"""

import numpy as np
from numba import carray, cfunc, njit

from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args
from ggtools.runtime.kernels.ggmlmath import EXACT, fma
from ggtools.runtime.kernels.matmul import dot_one_row
from ggtools.runtime.kernels.ops import rms_norm_row, sigmoid, silu_rows
from ggtools.runtime.kernels.workers import (ARGS, CFUNC, CONTROL_SIZE, ENTRY_SIGNATURE, Job, array_2d, array_3d,
                                             claim, close_job, enter, leave, publish, put_array)
from ggtools.runtime.model.pieces import DeltaNetTensors
from ggtools.runtime.weights import MatrixGroup

F32 = np.float32
NO_OUTPUT = np.zeros((0, 0), np.float32)


@njit(**EXACT)
def conv_rows(conv_state, qkv, weight, out):
    """ggml_ssm_conv over the conv state's K - 1 rows followed by the T rows of qkv: out[t, c] =
    sum_i row[t + i, c] * weight[i, c], each product and sum rounded, in order of i; then the state becomes
    the last K - 1 rows. conv_state: (K - 1, C); weight: (K, C), the taps of each channel."""
    n_tokens, n_channels = out.shape
    kept = conv_state.shape[0]
    window = np.empty((kept + n_tokens, n_channels), np.float32)
    window[:kept] = conv_state
    window[kept:] = qkv
    for t in range(n_tokens):
        row = out[t]
        row[:] = 0.0
        for i in range(kept + 1):
            src, taps = window[t + i], weight[i]
            for c in range(n_channels):
                row[c] = row[c] + src[c] * taps[c]
    conv_state[:] = window[n_tokens:]


@njit(**EXACT)
def l2_norm_heads(x, head_dim, eps, out):
    """Each head_dim slice of each row: rms_norm(eps / n), then a scale by 1 / sqrtf(n) (build_gdn_l2_norm).
    eps: the model's rms eps (float32)."""
    n = F32(head_dim)
    head_eps = eps / n
    rescale = F32(1.0) / np.sqrt(n)
    no_weight = np.ones(head_dim, np.float32)
    for t in range(x.shape[0]):
        for h in range(x.shape[1] // head_dim):
            part = out[t, h * head_dim:(h + 1) * head_dim]
            rms_norm_row(x[t, h * head_dim:(h + 1) * head_dim], no_weight, head_eps, part)
            for i in range(head_dim):
                part[i] = part[i] * rescale


@njit(**EXACT)
def conv_silu_l2(conv_state, qkv, weight, key_dim, head_dim, eps, conv, qk):
    """The conv (advancing conv_state), SiLU, and the L2 norms of the q and k heads: conv (T, C) gets the
    SiLU output (v is its last value_dim columns), qk (T, 2 key_dim) the normed q and k."""
    conv_rows(conv_state, qkv, weight, conv)
    silu_rows(conv, conv)
    l2_norm_heads(conv[:, :2 * key_dim], head_dim, eps, qk)


@njit(**EXACT)
def decay_and_beta(alpha, beta_in, dt_bias, a, g, beta):
    """g = softplus(alpha + dt_bias) * a (ggml's softplus: x above 20 is kept); beta = sigmoid(beta_in)."""
    for t in range(alpha.shape[0]):
        for h in range(alpha.shape[1]):
            x = alpha[t, h] + dt_bias[h]
            soft = x if x > F32(20.0) else np.log(F32(1.0) + np.exp(x))
            g[t, h] = soft * a[h]
            beta[t, h] = sigmoid(beta_in[t, h])


@njit(**EXACT)
def delta_rule_heads(q, k, v, g, beta, state, head_dim, out, counter):
    """The gated delta rule over T tokens, one task per v-head; state (n_v_heads, S, S) holds S transposed
    and is updated in place. q, k: (T, n_k_heads * S); v, out: (T, n_v_heads * S); out may be empty
    (replaying inputs only to rebuild the state). g: (T, n_v_heads), one decay per head, or (T, n_v_heads * S),
    one per key channel (KDA: ggml_gated_delta_net's kda mode, S[i][:] *= exp(g[i]))."""
    n_tokens = v.shape[0]
    n_v_heads = state.shape[0]
    n_k_heads = q.shape[1] // head_dim
    per_channel = g.shape[1] != n_v_heads
    scale = F32(1.0) / np.sqrt(F32(head_dim))
    delta = np.empty(head_dim, np.float32)
    decays = np.empty(head_dim, np.float32)
    kt = np.empty((1, head_dim), np.float32)     # contiguous copies of the head's k and q rows
    qt = np.empty((1, head_dim), np.float32)
    enter(counter)
    while True:
        h = claim(counter)
        if h >= n_v_heads:
            break
        m = state[h]
        flat = m.reshape(head_dim * head_dim)
        hk = h % n_k_heads
        for t in range(n_tokens):
            kt[0] = k[t, hk * head_dim:(hk + 1) * head_dim]
            if per_channel:
                for i in range(head_dim):
                    decays[i] = np.exp(g[t, h * head_dim + i])
                for j in range(head_dim):
                    row = m[j]
                    for i in range(head_dim):
                        row[i] = row[i] * decays[i]
            else:
                decay = np.exp(g[t, h])
                for i in range(flat.size):
                    flat[i] = flat[i] * decay
            for j in range(head_dim):
                delta[j] = (v[t, h * head_dim + j] - dot_one_row(m[j], kt, 0, False)) * beta[t, h]
            for j in range(head_dim):
                row, d = m[j], delta[j]
                for i in range(head_dim):
                    row[i] = fma(kt[0, i], d, row[i])
            if out.size:
                qt[0] = q[t, hk * head_dim:(hk + 1) * head_dim]
                for j in range(head_dim):
                    out[t, h * head_dim + j] = dot_one_row(m[j], qt, 0, False) * scale
    leave(counter)


@njit(**EXACT)
def delta_rule_parts(qk, conv, key_dim, g, beta, state, head_dim, out, counter):
    """delta_rule_heads on the recurrences' layout: q and k qk's first and last key_dim columns, v conv's columns
    from 2 * key_dim."""
    delta_rule_heads(qk[:, :key_dim], qk[:, key_dim:], conv[:, 2 * key_dim:], g, beta, state, head_dim, out, counter)


@njit(**EXACT)
def delta_rule_post(control, entry, qk, conv, key_dim, g, beta, state, head_dim, out):
    """delta_rule_parts on the workers' fast path (workers.py; contiguous arrays)."""
    control[ARGS], control[ARGS + 1] = key_dim, head_dim
    i = put_array(control, put_array(control, put_array(control, ARGS + 2, qk), conv), g)
    i = put_array(control, put_array(control, put_array(control, i, beta), state), out)
    publish(control, entry)
    delta_rule_parts(qk, conv, key_dim, g, beta, state, head_dim, out, control[0:2])
    close_job(control)


@cfunc(ENTRY_SIGNATURE, **CFUNC)
def delta_rule_entry(address):
    control = carray(address, (CONTROL_SIZE,))
    key_dim, head_dim = control[ARGS], control[ARGS + 1]
    qk, i = array_2d(control, ARGS + 2, np.float32)
    conv, i = array_2d(control, i, np.float32)
    g, i = array_2d(control, i, np.float32)
    beta, i = array_2d(control, i, np.float32)
    state, i = array_3d(control, i, np.float32)
    out, i = array_2d(control, i, np.float32)
    delta_rule_parts(qk, conv, key_dim, g, beta, state, head_dim, out, control[0:2])


DELTA_RULE = Job(delta_rule_parts, delta_rule_post, delta_rule_entry)


def run_delta_rule(qk, conv, key_dim: int, g, beta, state, head_dim: int, out) -> None:
    """delta_rule_parts over the workers."""
    n_v_heads = state.shape[0]
    workers.run_any(DELTA_RULE, n_v_heads, delta_rule_work(len(qk), n_v_heads, head_dim), workers.ATTENTION_MIN_WORK,
                    qk, conv, key_dim, g, beta, state, head_dim, out)


def delta_rule_work(n_tokens: int, n_v_heads: int, head_dim: int) -> int:
    """delta_rule_heads' multiply-adds over n_tokens (workers.run's measure)."""
    return n_tokens * n_v_heads * head_dim * head_dim * 3


def one_token_delta_rule_in_caller(n_v_heads: int, head_dim: int) -> bool:
    """Whether one token's delta rule runs in the calling thread (workers.run's rule), as the one-call paths run it
    (their matmuls split where worth it: matmul.plan_rows)."""
    return workers.in_caller(n_v_heads, delta_rule_work(1, n_v_heads, head_dim), workers.ATTENTION_MIN_WORK)


@njit(**EXACT)
def gated_norm_heads(x, weight, z, eps, out):
    """Per head: rms_norm(x) * weight * silu(z) (silu over each head_dim row of z, as ggml_silu runs it)."""
    head_dim = weight.size
    gate = np.empty((1, head_dim), np.float32)
    for t in range(x.shape[0]):
        for h in range(x.shape[1] // head_dim):
            part = out[t, h * head_dim:(h + 1) * head_dim]
            rms_norm_row(x[t, h * head_dim:(h + 1) * head_dim], weight, eps, part)
            silu_rows(z[t:t + 1, h * head_dim:(h + 1) * head_dim], gate)
            for i in range(head_dim):
                part[i] = part[i] * gate[0, i]


@njit(**EXACT)
def one_token_delta_net(x, norm, eps, fixed, proj, conv_state, ssm_state, g, beta, counter, x_out):
    """x_out = x + GatedDeltaNet.mix(rms_norm(x) * norm) on one token in one call, with the same kernels in the same
    order: the norm, the input projections (matmul.group_rows: qkv, z, beta, alpha side by side in proj),
    decay_and_beta, the recurrence (conv_silu_l2, delta_rule_heads; conv_state and ssm_state advanced),
    gated_norm_heads, the output projection, the residual. proj's qkv, g and beta are left with the step's inputs,
    for the state's log. fixed: GatedDeltaNet._one_token_args' tuple as a FixedArgs."""
    h, inputs, where, dt_bias, a, conv_weight, key_dim, head_dim, ssm_norm, ssm_eps, wout, conv, qk, core, normed = \
        fixed.args
    ops.rms_norm_rows(x, norm, eps, h)
    matmul.group_rows(inputs, where, h, counter, proj)
    channels, value_dim, n_v = conv.shape[1], core.shape[1], g.shape[1]
    qkv, z = proj[:, :channels], proj[:, channels:channels + value_dim]
    beta_in, alpha = proj[:, channels + value_dim:-n_v], proj[:, -n_v:]
    decay_and_beta(alpha, beta_in, dt_bias, a, g, beta)
    conv_silu_l2(conv_state, qkv, conv_weight, key_dim, head_dim, ssm_eps, conv, qk)
    workers.restart(counter)
    delta_rule_parts(qk, conv, key_dim, g, beta, ssm_state, head_dim, core, counter)
    gated_norm_heads(core, ssm_norm, z, ssm_eps, normed)
    out = matmul.plan_rows(wout, normed, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    for i in range(x.shape[1]):
        x_out[0, i] = out[0, i] + x[0, i]


class GatedDeltaNet(DeltaNetTensors):
    tree_verify = True

    def __post_init__(self):
        self.inputs = MatrixGroup(self.wqkv, self.wgate, self.wbeta, self.walpha)
        self.one_token = self._one_token_args()
        self.one_token_fixed = None if self.one_token is None else fixed_args(self.one_token)
        self.one_token_call = DirectCall(one_token_delta_net)

    def _one_token_args(self) -> tuple | None:
        """one_token_delta_net's arguments that stay from call to call (the input group's plans, MatrixGroup.
        one_token_args, the output projection's call_args, the tables, scratch written anew by every call); None
        where a plan has no one_call."""
        group = self.inputs.one_token_args()
        if group is None or self.wout.plan is None or not self.wout.plan.one_call:
            return None
        (plans, where), _ = group
        channels, value_dim = self.conv.shape[1], self.n_v_heads * self.head_dim
        h = np.empty((1, self.wqkv.n_cols), np.float32)
        conv, qk = np.empty((1, channels), np.float32), np.empty((1, 2 * self.key_dim), np.float32)
        core, normed = np.empty((2, 1, value_dim), np.float32)
        return (h, plans, where, self.dt_bias, self.a, self.conv, self.key_dim, self.head_dim, self.norm, F32(self.eps),
                self.wout.plan.call_args(1), conv, qk, core, normed)

    def with_residual(self, ops_, x, norm, eps, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        if len(x) == 1 and kv.tree is None and self.one_token is not None \
                and one_token_delta_rule_in_caller(self.n_v_heads, self.head_dim):
            return self._one_token(x, norm, eps, kv.recurrent[slot])
        return super().with_residual(ops_, x, norm, eps, positions, rope, kv, slot, hp, stepwise)

    def _one_token(self, x, norm, eps, state) -> np.ndarray:
        """with_residual on one token in one kernel call (one_token_delta_net): the same bits as mix, less the
        per-call glue; the step's inputs logged as mix logs them."""
        channels, n_v = self.conv.shape[1], self.n_v_heads
        proj = np.empty((1, channels + n_v * self.head_dim + 2 * n_v), np.float32)
        g, beta = np.empty((2, 1, n_v), np.float32)
        x_out = np.empty_like(x)
        self.one_token_call(x, norm, F32(eps), self.one_token_fixed, proj, state.conv, state.ssm, g, beta,
                            workers.one_call_counter(), x_out)
        state.append(proj[:, :channels].copy(), g, beta)
        return x_out

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        """The mixer interface: kv is a HybridCache and slot this layer's index among its recurrent states."""
        return self.mix(h, kv.recurrent[slot], stepwise, kv.tree)

    def mix(self, h: np.ndarray, state, stepwise: bool, tree=None) -> np.ndarray:
        """h: (T, n_embd) normed input; state: this layer's RecurrentState, advanced by T tokens (a tree batch,
        tree_batch.TreeBatch: each row from its parent row's state, one row at a time, the state itself left as it
        is)."""
        qkv, z, beta_in, alpha = self.inputs(h, stepwise)
        qkv = np.ascontiguousarray(qkv)     # a column view of the group's output; the log keeps only these
        g = np.empty_like(alpha)
        beta = np.empty_like(alpha)
        decay_and_beta(alpha, beta_in, self.dt_bias, self.a, g, beta)
        core = np.empty((len(h), self.n_v_heads * self.head_dim), np.float32)
        state.advance(qkv, g, beta, lambda conv, ssm, r: self.recur(conv, ssm, qkv[r], g[r], beta[r], core[r]), tree)
        normed = np.empty_like(core)
        gated_norm_heads(core, self.norm, z, F32(self.eps), normed)
        return self.wout(normed, stepwise)

    def recur(self, conv_state, ssm_state, qkv, g, beta, out=NO_OUTPUT) -> None:
        """Advance conv_state ((K - 1, C)) and ssm_state ((n_v_heads, S, S)) over the rows of qkv, g, beta,
        writing the heads' outputs to out (T, value_dim) unless it is empty."""
        conv = np.empty_like(qkv)
        qk = np.empty((len(qkv), 2 * self.key_dim), np.float32)
        conv_silu_l2(conv_state, qkv, self.conv, self.key_dim, self.head_dim, F32(self.eps), conv, qk)
        run_delta_rule(qk, conv, self.key_dim, g, beta, ssm_state, self.head_dim, out)
