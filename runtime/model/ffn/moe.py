"""Routed experts (qwen3moe, gpt-oss; the routed part of qwen35moe), as llama.cpp's build_moe_ffn computes them.

    logits  = router . h (+ router bias)                       ffn_gate_inp
    SOFTMAX:        probs = softmax(logits); the k largest probs, weights = those probs
    SOFTMAX_WEIGHT: the k largest logits, weights = softmax over those k logits (gpt-oss)
    weights /= max(sum(weights), 2^-14)                        normalized routings (qwen3moe)
    out     = sum over the k slots, in descending order, of weight * down_e(act(gate_e(h), up_e(h)))

with the experts' optional biases added after each expert matmul and act SwiGLU or gpt-oss's clamped
variant. The experts' matmuls are llama.cpp's mul_mat_id: every row of a batch is a one-row dot, so a token's
output does not depend on the batch. Rows are grouped by expert, so a verify batch reads each routed expert's
weights once, and experts no token routes to are never read (their pages are never touched).

A shared expert (qwen35moe) composes with this class: `RoutedExperts` is the routed part only.
"""

import numpy as np
from numba import njit

from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args, unpacked
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.model.ffn.one_call import OneCallFFN
from ggtools.runtime.model.pieces import SOFTMAX, SWIGLU_OAI, RoutedExpertsTensors
from ggtools.runtime.weights import MatrixGroup

WEIGHTS_SUM_MIN = np.float32(6.103515625e-5)   # build_moe_ffn clamps the weights' sum (the smallest normal f16)
NO_ROUTER_BIAS = np.zeros(0, np.float32)


@njit(**EXACT)
def top_k(scores, k, experts_row):
    """The ids of the k largest scores into experts_row, in descending order, ties to the lower id
    (ggml_argsort_top_k)."""
    n_expert = scores.shape[0]
    taken = np.zeros(n_expert, np.bool_)
    for j in range(k):
        best = -1
        for e in range(n_expert):
            if not taken[e] and (best < 0 or scores[e] > scores[best]):
                best = e
        taken[best] = True
        experts_row[j] = best


@njit(**EXACT)
def normalize_and_scale(weights_row, normalize, scale):
    """A token's k weights divided by their sum (clamped at WEIGHTS_SUM_MIN) when normalized, then times the
    scale (0 and 1: none), as build_moe_ffn does."""
    if normalize:
        total = np.float64(0.0)
        for j in range(weights_row.shape[0]):
            total += np.float64(weights_row[j])
        norm = max(np.float32(total), WEIGHTS_SUM_MIN)
        for j in range(weights_row.shape[0]):
            weights_row[j] = weights_row[j] / norm
    if scale != np.float32(0.0) and scale != np.float32(1.0):
        for j in range(weights_row.shape[0]):
            weights_row[j] = weights_row[j] * scale


@njit(**EXACT)
def route_rows(logits, bias, k, gating, normalize, scale, experts, weights):
    """Per token: the k experts in descending order of probability (ggml_argsort_top_k; ties to the lower id)
    and their weights, as build_moe_ffn computes them from the router's logits (T, n_expert) plus its bias
    (empty: none)."""
    n_expert = logits.shape[1]
    row = np.empty(n_expert, np.float32)
    probs = np.empty(n_expert, np.float32)
    picked = np.empty(k, np.float32)
    for t in range(logits.shape[0]):
        for e in range(n_expert):
            row[e] = logits[t, e] + bias[e] if bias.size else logits[t, e]
        if gating == SOFTMAX:
            ops.soft_max(row, probs, np.float32(-np.inf))
        else:
            probs[:] = row
        top_k(probs, k, experts[t])
        for j in range(k):
            picked[j] = probs[experts[t, j]]
        if gating == SOFTMAX:
            weights[t] = picked
        else:
            ops.soft_max(picked, weights[t], np.float32(-np.inf))
        normalize_and_scale(weights[t], normalize, scale)


@njit(**EXACT)
def group_by_expert(experts, n_expert):
    """The T * k slots (token t, rank j) sorted by expert, in (t, j) order within an expert (mul_mat_id's
    row groups). Returns the token of each sorted slot, its expert, each slot's sorted position (T * k,
    in (t, j) order), the experts used and the group bounds (len(used) + 1)."""
    n_tokens, k = experts.shape
    counts = np.zeros(n_expert + 1, np.int64)
    for t in range(n_tokens):
        for j in range(k):
            counts[experts[t, j] + 1] += 1
    n_used = 0
    for e in range(n_expert):
        n_used += counts[e + 1] > 0
        counts[e + 1] += counts[e]
    used, groups = np.empty(n_used, np.int64), np.empty(n_used + 1, np.int64)
    g = 0
    for e in range(n_expert):
        if counts[e + 1] > counts[e]:
            used[g], groups[g] = e, counts[e]
            g += 1
    groups[n_used] = n_tokens * k
    rows, sorted_experts = np.empty(n_tokens * k, np.int64), np.empty(n_tokens * k, np.int64)
    slot_pos = np.empty(n_tokens * k, np.int64)
    for t in range(n_tokens):
        for j in range(k):
            e = experts[t, j]
            p = counts[e]
            counts[e] += 1
            rows[p], sorted_experts[p], slot_pos[t * k + j] = t, e, p
    return rows, sorted_experts, slot_pos, used, groups


@njit(**EXACT)
def add_expert_bias(x, bias, sorted_experts):
    """ggml_add_id: each row plus its expert's bias row (in place; an empty bias adds nothing)."""
    if bias.size:
        for r in range(x.shape[0]):
            for i in range(x.shape[1]):
                x[r, i] = x[r, i] + bias[sorted_experts[r], i]


@njit(**EXACT)
def activate(gate, up, gate_bias, up_bias, sorted_experts, oai, out):
    """out = act(gate + gate bias, up + up bias) per row (biases by the row's expert): SwiGLU, or with oai
    gpt-oss's clamped variant (alpha 1.702, limit 7, as llama.cpp's graph passes them)."""
    add_expert_bias(gate, gate_bias, sorted_experts)
    add_expert_bias(up, up_bias, sorted_experts)
    if oai:
        ops.swiglu_oai_rows(gate, up, np.float32(1.702), np.float32(7.0), out)
    else:
        ops.swiglu_rows(gate, up, out)


@njit(**EXACT)
def combine_rows(down, bias, sorted_experts, slot_pos, weights, out):
    """out[t] = w[t, 0] * (down of slot (t, 0) + its bias) + w[t, 1] * ... added in slot order: add_id, then
    ggml_mul by the weights, then one ggml_add per slot."""
    k = weights.shape[1]
    for t in range(out.shape[0]):
        for i in range(out.shape[1]):
            acc = np.float32(0.0)
            for j in range(k):
                p = slot_pos[t * k + j]
                v = down[p, i] + bias[sorted_experts[p], i] if bias.size else down[p, i]
                acc = v * weights[t, j] if j == 0 else acc + v * weights[t, j]
            out[t, i] = acc


@njit(**EXACT)
def one_token_experts(x, residual, norm, eps, h, moe, experts, weights, counter, out):
    """RoutedExperts on one token in one call, with the same kernels in the same order as the general path: with
    residual, out = x + the experts of rms_norm(x) * norm, else out = the experts of x. The router (route_rows), the
    input rounded once and taken k times, gate and up (one plan), activate, the activations rounded, down,
    combine_rows. moe: RoutedExperts.one_token (the plans: MatmulPlan.call_args for one row, k rows and k rows; or
    it as a FixedArgs); experts, weights: (1, k) scratch for the routing."""
    (router, router_bias, gating, normalize, scale, gate_up, gate_cols, up_cols, down, gate_bias, up_bias, down_bias,
     oai, act, slot_pos, groups) = unpacked(moe)
    if residual:
        ops.rms_norm_rows(x, norm, eps, h)
    else:
        h[:] = x
    logits = matmul.plan_rows(router, h, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    route_rows(logits, router_bias, experts.shape[1], gating, normalize, scale, experts, weights)
    used = experts[0]
    gu = matmul.plan_rows(gate_up, h, True, used, groups, counter)
    activate(gu[:, gate_cols[0]:gate_cols[1]], gu[:, up_cols[0]:up_cols[1]], gate_bias, up_bias, used, oai, act)
    dn = matmul.plan_rows(down, act, False, used, groups, counter)
    combine_rows(dn, down_bias, used, slot_pos, weights, out)
    if residual:
        for i in range(out.shape[1]):
            out[0, i] = out[0, i] + x[0, i]


class RoutedExperts(RoutedExpertsTensors, OneCallFFN):
    """The routed-expert FFN of one layer on numba: rows grouped by expert, each routed expert's stack read once."""

    def __post_init__(self):
        self.gate_up, self.down_group = MatrixGroup(self.gate, self.up), MatrixGroup(self.down)
        self.weights_scale = np.float32(self.weights_scale)
        self.bias = NO_ROUTER_BIAS if self.router_bias is None else self.router_bias
        self.oai = self.routing.activation == SWIGLU_OAI
        k = self.n_expert_used
        # one token's slots as group_by_expert gives them, less the sort: input row 0 k times, slot j in place j
        self.one_token_slots = np.zeros(k, np.int64), np.arange(k), np.arange(k + 1)
        self.one_token = self._one_token_args()
        self.one_token_fixed = None if self.one_token is None else fixed_args(self.one_token)
        self.one_token_calls = DirectCall(one_token_experts), DirectCall(one_token_experts)  # __call__, with_residual

    def _one_token_args(self):
        """one_token_experts' fixed arguments and scratch arrays, where it applies: the router one plan, gate and up
        another, down a third, all with one_call, no expert stack paged (its bytes are asked for before the kernels
        run); else None."""
        if len(self.gate_up.parts) != 1 or len(self.down_group.parts) != 1 or self.gate_up.paged \
                or self.down_group.paged:
            return None
        router, (idx, gate_up), (_, down) = self.router.plan, self.gate_up.parts[0], self.down_group.parts[0]
        if router is None or not (router.one_call and gate_up.one_call and down.one_call):
            return None
        k = self.n_expert_used
        gate_cols, up_cols = (np.array(gate_up.columns[idx.index(i)], np.int64) for i in (0, 1))
        act = np.empty((k, self.gate.n_rows), np.float32)
        _, slot_pos, groups = self.one_token_slots
        return (router.call_args(1), self.bias, self.routing.gating, self.routing.normalize, self.weights_scale,
                gate_up.call_args(k), gate_cols, up_cols, down.call_args(k), self.gate_bias, self.up_bias,
                self.down_bias, self.oai, act, slot_pos, groups)

    def route(self, h: np.ndarray, stepwise: bool) -> tuple[np.ndarray, np.ndarray]:
        """(T, n_embd) -> experts (T, k) int64 in descending order of probability, weights (T, k) float32."""
        experts = np.empty((len(h), self.n_expert_used), np.int64)
        weights = np.empty((len(h), self.n_expert_used), np.float32)
        route_rows(self.router(h, stepwise), self.bias, self.n_expert_used, self.routing.gating,
                   self.routing.normalize, self.weights_scale, experts, weights)
        return experts, weights

    def slots(self, experts: np.ndarray) -> tuple:
        """group_by_expert's slots. One token's k experts are distinct, so each is a group of one row already:
        taken in rank order instead of expert order (every row is its own dot, so the order changes no bit)."""
        if len(experts) > 1:
            return group_by_expert(experts, self.n_expert)
        rows, slot_pos, groups = self.one_token_slots
        return rows, experts[0], slot_pos, experts[0], groups

    def with_residual(self, ops_, x, norm, eps, stepwise: bool) -> np.ndarray:
        if self.in_one_call(x):
            return self._one_token(x, True, norm, eps)
        return super().with_residual(ops_, x, norm, eps, stepwise)

    def __call__(self, h: np.ndarray, stepwise: bool) -> np.ndarray:
        if self.in_one_call(h):
            return self._one_token(np.ascontiguousarray(h, np.float32), False, NO_ROUTER_BIAS, 0.0)
        experts, weights = self.route(h, stepwise)
        rows, sorted_experts, slot_pos, used, groups = self.slots(experts)
        self.down_group.prefetch(used)      # experts paged from disk: down's bytes come in while gate and up run
        gate, up = self.gate_up.run_experts(h, rows, used, groups)
        act = np.empty_like(gate)
        activate(gate, up, self.gate_bias, self.up_bias, sorted_experts, self.oai, act)
        (down,) = self.down_group.run_experts(act, None, used, groups)
        out = np.empty((len(h), down.shape[1]), np.float32)
        combine_rows(down, self.down_bias, sorted_experts, slot_pos, weights, out)
        return out

    def _one_token(self, x: np.ndarray, residual: bool, norm: np.ndarray, eps: float) -> np.ndarray:
        """One token in one kernel call (one_token_experts): the same bits as the general path, less the per-call
        glue; with residual, with_residual's result, else __call__'s."""
        k = self.n_expert_used
        out = np.empty_like(x)
        self.one_token_calls[residual](x, residual, norm, np.float32(eps), np.empty_like(x), self.one_token_fixed,
                                       np.empty((1, k), np.int64), np.empty((1, k), np.float32),
                                       workers.one_call_counter(), out)
        return out
