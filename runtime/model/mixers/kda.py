"""KDA (Kimi Delta Attention): kimi-k3's linear-attention mixer, as llama.cpp's CPU backend runs it
(build_kda_layer in src/models/kimi-k3.cpp, the fused ggml_gated_delta_net op in its per-channel mode).

Per token, with d = n_head * S channels (S = kda.head_dim):

    q, k, v = silu(short causal conv of W_q x), of W_k x, of W_v x     (the K - 1 earlier rows: the conv state)
    q, k    = l2norm per head                                          (rms_norm(eps / S), then 1 / sqrt(S))
    g       = W_f_b (W_f_a x) + dt_bias                                 (per channel)
              with kda.gate_lower_bound lb:  lb * sigmoid(-(g * A))     (A = -exp(A_log), per head)
              without:                       softplus(g) * A
    beta    = sigmoid(W_beta x)                                         (per head)
    per head: S_i,: *= exp(g_i);  delta = (v - S^T k) beta;  S += k delta^T;  o = S^T q / sqrt(S)
    out     = W_o (rmsnorm(o) * norm * sigmoid(W_g x))                  (per head)

Each step is one ggml op rounded to float32, in the graph's order (scale by -1 and the products separately;
libm expf, logf, sigmoid). The recurrence is gated_delta_net.delta_rule_heads (its per-channel decay), the
conv the same per-channel chain as qwen35's; the recurrence runs per token whatever the batch, so a verify
batch gives one-token steps' bits and the rollback (hybrid_cache.RecurrentState) replays the logged inputs. A draft
tree's rows (tree_batch.py) run as Gated DeltaNet's do: each from its parent row's state (RecurrentState.walk_tree),
the accepted path's rows replayed by keep_path.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels import matmul, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.kernels.ops import rms_norm_row, sigmoid, sigmoid_rows, silu_rows
from ggtools.runtime.model.kimi_k3_pieces import KDATensors
from ggtools.runtime.model.mixers.gated_delta_net import (NO_OUTPUT, conv_rows, delta_rule_parts, l2_norm_heads,
                                                            one_token_delta_rule_in_caller, run_delta_rule)
from ggtools.runtime.weights import MatrixGroup

F32 = np.float32


@njit(**EXACT)
def decay_gate(g, dt_bias, a, head_dim, lower_bound, out):
    """out = the per-channel decay from W_f_b (W_f_a x) (g: (T, d)), as kimi-k3.cpp builds g1."""
    for t in range(g.shape[0]):
        for c in range(g.shape[1]):
            x = g[t, c] + dt_bias[c]
            if lower_bound > -np.inf:
                out[t, c] = sigmoid((x * a[c // head_dim]) * F32(-1.0)) * lower_bound
            else:
                soft = x if x > F32(20.0) else np.log(F32(1.0) + np.exp(x))
                out[t, c] = soft * a[c // head_dim]


@njit(**EXACT)
def sigmoid_gated_norm_heads(x, weight, gate, eps, out):
    """Per head: rms_norm(x) * weight * sigmoid(gate) (build_norm, then ggml_mul by ggml_sigmoid)."""
    head_dim = weight.size
    for t in range(x.shape[0]):
        for h in range(x.shape[1] // head_dim):
            part = out[t, h * head_dim:(h + 1) * head_dim]
            rms_norm_row(x[t, h * head_dim:(h + 1) * head_dim], weight, eps, part)
            for i in range(head_dim):
                part[i] = part[i] * sigmoid(gate[t, h * head_dim + i])


@njit(**EXACT)
def conv_silu_l2_parts(conv_state, qkv, weight, d, head_dim, eps, conv, qk):
    """The q, k and v convolutions (one per-channel chain over the 3 d channels, advancing conv_state), SiLU on
    each of the three (ggml_silu per tensor), the L2 norms of the q and k heads into qk (T, 2 d)."""
    conv_rows(conv_state, qkv, weight, conv)
    for part in range(3):
        silu_rows(conv[:, part * d:(part + 1) * d], conv[:, part * d:(part + 1) * d])
    l2_norm_heads(conv[:, :2 * d], head_dim, eps, qk)


@njit(**EXACT)
def one_token_kda(h, fixed, proj, conv_state, ssm_state, g, beta, counter):
    """KDA.mix on one token in one call, with the same kernels in the same order: the input projections
    (matmul.group_rows: q, k, v, f_a, beta, the gate side by side in proj), f_b, decay_gate, beta's sigmoid, the
    recurrence (conv_silu_l2_parts, delta_rule_heads; conv_state and ssm_state advanced), sigmoid_gated_norm_heads,
    the output projection. Returns its out; proj's q, k, v, g and beta are left with the step's inputs, for the
    state's log. fixed: KDA._one_token_args' tuple as a FixedArgs."""
    inputs, where, wf_b, dt_bias, a, head_dim, lower_bound, conv_weight, eps, norm, wo, conv, qk, core, normed = \
        fixed.args
    matmul.group_rows(inputs, where, h, counter, proj)
    d, n_head = core.shape[1], beta.shape[1]
    f_a = np.ascontiguousarray(proj[:, 3 * d:3 * d + head_dim])    # one row: no copy; plan_rows takes C arrays
    decay_gate(matmul.plan_rows(wf_b, f_a, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter), dt_bias, a,
               head_dim, lower_bound, g)
    sigmoid_rows(proj[:, 3 * d + head_dim:3 * d + head_dim + n_head], beta)
    conv_silu_l2_parts(conv_state, proj[:, :3 * d], conv_weight, d, head_dim, eps, conv, qk)
    workers.restart(counter)
    delta_rule_parts(qk, conv, d, g, beta, ssm_state, head_dim, core, counter)
    sigmoid_gated_norm_heads(core, norm, proj[:, 3 * d + head_dim + n_head:], eps, normed)
    return matmul.plan_rows(wo, normed, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)


class KDA(KDATensors):
    tree_verify = True

    def __post_init__(self):
        self.inputs = MatrixGroup(self.wq, self.wk, self.wv, self.wf_a, self.wbeta, self.wg)
        self.lower_bound = F32(self.gate_lower_bound)
        self.one_token = self._one_token_args()
        self.one_token_fixed = None if self.one_token is None else fixed_args(self.one_token)
        self.one_token_call = DirectCall(one_token_kda)

    def _one_token_args(self):
        """one_token_kda's arguments that stay from call to call (the input group's plans, MatrixGroup.one_token_args,
        f_b's and the output projection's call_args, the tables, scratch written anew by every call); None where a
        plan has no one_call."""
        group, rest = self.inputs.one_token_args(), [self.wf_b.plan, self.wo.plan]
        if group is None or not all(plan is not None and plan.one_call for plan in rest):
            return None
        (plans, where), _ = group
        d = self.d_inner
        conv, qk, core, normed = (np.empty((1, n * d), np.float32) for n in (3, 2, 1, 1))
        return (plans, where, rest[0].call_args(1), self.dt_bias, self.a, self.head_dim, self.lower_bound, self.conv,
                F32(self.eps), self.norm, rest[1].call_args(1), conv, qk, core, normed)

    def _in_one_call(self, h, tree) -> bool:
        """Whether h (one token, no tree) runs as one_token_kda: the path applies, and the delta rule would run in
        this thread (workers.run's rule; the matmuls split where worth it: matmul.plan_rows)."""
        return len(h) == 1 and tree is None and self.one_token is not None \
            and one_token_delta_rule_in_caller(self.n_v_heads, self.head_dim)

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> np.ndarray:
        """The mixer interface: kv is a HybridCache and slot this layer's index among its recurrent states."""
        if self._in_one_call(h, kv.tree):
            return self._one_token(h, kv.recurrent[slot])
        return self.mix(h, kv.recurrent[slot], stepwise, kv.tree)

    def _one_token(self, h, state) -> np.ndarray:
        """mix on one token in one kernel call (one_token_kda): the same bits, less the per-call glue; the step's
        inputs logged as mix logs them."""
        d, n_head = self.d_inner, self.n_v_heads
        proj = np.empty((1, 4 * d + self.head_dim + n_head), np.float32)
        g, beta = np.empty((1, d), np.float32), np.empty((1, n_head), np.float32)
        out = self.one_token_call(np.ascontiguousarray(h, np.float32), self.one_token_fixed, proj, state.conv,
                                  state.ssm, g, beta, workers.one_call_counter())
        state.append(proj[:, :3 * d].copy(), g, beta)
        return out.copy()

    def mix(self, h: np.ndarray, state, stepwise: bool, tree=None) -> np.ndarray:
        """h: (T, n_embd) normed input; state: this layer's RecurrentState, advanced by T tokens (a tree batch,
        tree_batch.TreeBatch: each row from its parent row's state, one row at a time, the state itself left as it
        is)."""
        q, k, v, f_a, beta_in, gate = self.inputs(h, stepwise)
        qkv = np.concatenate([q, k, v], axis=1)
        g = self.wf_b(f_a, stepwise)
        decay_gate(g, self.dt_bias, self.a, self.head_dim, self.lower_bound, g)
        beta = np.empty_like(beta_in)
        sigmoid_rows(beta_in, beta)
        core = np.empty((len(h), self.d_inner), np.float32)
        state.advance(qkv, g, beta, lambda conv, ssm, r: self.recur(conv, ssm, qkv[r], g[r], beta[r], core[r]), tree)
        normed = np.empty_like(core)
        sigmoid_gated_norm_heads(core, self.norm, gate, F32(self.eps), normed)
        return self.wo(normed, stepwise)

    def recur(self, conv_state, ssm_state, qkv, g, beta, out=NO_OUTPUT) -> None:
        """Advance conv_state ((K - 1, 3 d)) and ssm_state ((n_head, S, S)) over the rows of qkv, g, beta, writing
        the heads' outputs to out (T, d) unless it is empty."""
        d = self.d_inner
        conv = np.empty_like(qkv)
        qk = np.empty((len(qkv), 2 * d), np.float32)
        conv_silu_l2_parts(conv_state, qkv, self.conv, d, self.head_dim, F32(self.eps), conv, qk)
        run_delta_rule(qk, conv, d, g, beta, ssm_state, self.head_dim, out)
