"""kimi-k3's FFNs on numba, as llama.cpp's graph computes them (src/models/kimi-k3.cpp, build_moe_ffn):

- SituFFN: down(situ(gate(h), up(h))), the leading dense layers and the shared experts;
- LatentMoE: sigmoid routing over the full-width input, the selection biased by exp_probs_b (the weights are
  the unbiased probabilities), optionally normalized (sum clamped at 2^-14) and scaled; the routed experts run
  on routed_down(h) (the latent), their weighted sum goes through routed_norm and routed_up; plus the shared
  experts on h.

    probs   = sigmoid(router . h)                  libm expf, one ggml op
    experts = top-k of probs + exp_probs_b          ggml_argsort_top_k: descending, ties to the lower id
    weights = probs[experts] (/ max(sum, 2^-14)) (* scale)

As for the other routed-expert FFNs (moe.py), every expert row is a one-row dot (mul_mat_id) and experts no
token routes to are never read.
"""

import numpy as np
from numba import carray, cfunc, njit

from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.quants.floatbits import f32_bits, f32_from_bits
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.kernels.workers import (ARGS, CFUNC, CONTROL_SIZE, ENTRY_SIGNATURE, Job, array_2d, claim,
                                             close_job, enter, leave, publish, put_array, put_rows, rows_2d)
from ggtools.runtime.model.ffn.dense import DenseFFN
from ggtools.runtime.model.ffn.moe import RoutedExperts, combine_rows, normalize_and_scale, top_k
from ggtools.runtime.model.kimi_k3_pieces import LatentMoETensors, SituFFNTensors
from ggtools.runtime.model.pieces import Piece
from ggtools.runtime.weights import MatrixGroup

F32 = np.float32
NO_BIAS = np.zeros((0, 0), np.float32)


@njit(**EXACT)
def route_sigmoid_rows(logits, selection_bias, k, normalize, scale, experts, weights):
    """Per token: the k experts of largest sigmoid(logit) + selection bias, in descending order (ties to the
    lower id), and their unbiased probabilities as weights (build_moe_ffn with SIGMOID gating and exp_probs_b)."""
    n_expert = logits.shape[1]
    probs = np.empty(n_expert, np.float32)
    selection = np.empty(n_expert, np.float32)
    for t in range(logits.shape[0]):
        for e in range(n_expert):
            probs[e] = ops.sigmoid(logits[t, e])
            selection[e] = probs[e] + selection_bias[e]
        top_k(selection, k, experts[t])
        for j in range(k):
            weights[t, j] = probs[experts[t, j]]
        normalize_and_scale(weights[t], normalize, scale)


@njit(**EXACT)
def situ_tasks(gate, up, beta, linear_beta, out, counter):
    """ops.situ_rows, one task per row."""
    enter(counter)
    while True:
        r = claim(counter)
        if r >= gate.shape[0]:
            break
        ops.situ_rows(gate[r:r + 1], up[r:r + 1], beta, linear_beta, out[r:r + 1])
    leave(counter)


@njit(**EXACT)
def situ_post(control, entry, gate, up, beta, linear_beta, out):
    """situ_tasks on the workers' fast path (workers.py; gate and up: unit-stride rows, out contiguous)."""
    control[ARGS], control[ARGS + 1] = np.int64(f32_bits(beta)), np.int64(f32_bits(linear_beta))
    put_array(control, put_rows(control, put_rows(control, ARGS + 2, gate), up), out)
    publish(control, entry)
    situ_tasks(gate, up, beta, linear_beta, out, control[0:2])
    close_job(control)


@cfunc(ENTRY_SIGNATURE, **CFUNC)
def situ_entry(address):
    control = carray(address, (CONTROL_SIZE,))
    beta, linear_beta = f32_from_bits(control[ARGS]), f32_from_bits(control[ARGS + 1])
    gate, i = rows_2d(control, ARGS + 2, np.float32)
    up, i = rows_2d(control, i, np.float32)
    out, i = array_2d(control, i, np.float32)
    situ_tasks(gate, up, beta, linear_beta, out, control[0:2])


SITU = Job(situ_tasks, situ_post, situ_entry)
# a value's situ (libm tanhf, expf, tanhf) as multiply-adds of a matmul (workers.run's measure): situ_rows measured
# 27 ns a value, a 16-row Q8_0 batch 0.02 ns a multiply-add
SITU_WORK_PER_VALUE = 1024


def situ(gate: np.ndarray, up: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    """situ_rows over the workers, a row per task (gate and up: rows of unit stride)."""
    out = np.empty((len(gate), gate.shape[1]), np.float32)
    work = gate.size * SITU_WORK_PER_VALUE
    if gate.strides[1] == up.strides[1] == 4:
        workers.run_job(SITU, len(gate), work, workers.MATMUL_MIN_WORK, gate, up, F32(beta), F32(linear_beta), out)
    else:
        workers.run(situ_tasks, len(gate), work, workers.MATMUL_MIN_WORK, gate, up, F32(beta), F32(linear_beta), out)
    return out


@njit(**EXACT)
def situ_ffn(h, ffn, beta, linear_beta, counter):
    """SituFFN on one token h: gate and up (one plan), situ into act, down. Returns down's out. ffn: dense.DenseFFN's
    one_token (gate_up, gate_cols, up_cols, down, act; gate_up, down: MatmulPlan.call_args for one row) as a
    FixedArgs."""
    gate_up, gate_cols, up_cols, down, act = ffn.args
    gu = matmul.plan_rows(gate_up, h, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    ops.situ_rows(gu[:, gate_cols[0]:gate_cols[1]], gu[:, up_cols[0]:up_cols[1]], beta, linear_beta, act)
    return matmul.plan_rows(down, act, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)


@njit(**EXACT)
def one_token_latent_moe(h, fixed, experts, weights, counter, out):
    """latent_moe_on_token with its fixed arguments (LatentMoE._one_token_args' tuple) as a FixedArgs."""
    latent_moe_on_token(h, *fixed.args, experts, weights, counter, out)


# routed_up and shared_down may be None: as arguments (not fields of a FixedArgs) numba prunes the branches they skip
@njit(**EXACT)
def latent_moe_on_token(h, inputs, where, proj, routed_cols, shared_cols, probs_bias, normalize, scale, gate_up,
                        gate_cols, up_cols, down, slot_pos, groups, latent, act, beta, linear_beta, routed_norm, eps,
                        routed_up, shared_down, shared_act, shared_beta, shared_linear_beta, experts, weights,
                        counter, out):
    """LatentMoE on one token in one call, with the same kernels in the same order: the full-width matmuls
    (matmul.group_rows: the router, routed_down, the shared experts' gate and up side by side in proj), the
    routing, the routed experts on the latent (proj's routed_cols, or h without routed_down: routed_cols[0] < 0),
    situ, down, combine_rows, routed_norm (empty: none), routed_up (None: none), the shared experts' situ and down
    (shared_down None: none), their sum into out (1, n_embd)."""
    matmul.group_rows(inputs, where, h, counter, proj)
    k = experts.shape[1]
    route_sigmoid_rows(proj[:, :probs_bias.size], probs_bias, k, normalize, scale, experts, weights)
    if routed_cols[0] < 0:
        latent[:] = h
    else:
        latent[:] = proj[:, routed_cols[0]:routed_cols[1]]
    used = experts[0]
    gu = matmul.plan_rows(gate_up, latent, True, used, groups, counter)
    ops.situ_rows(gu[:, gate_cols[0]:gate_cols[1]], gu[:, up_cols[0]:up_cols[1]], beta, linear_beta, act)
    dn = matmul.plan_rows(down, act, False, used, groups, counter)
    combined = np.empty((1, dn.shape[1]), np.float32)
    combine_rows(dn, NO_BIAS, used, slot_pos, weights, combined)
    if routed_norm.size:
        ops.rms_norm_rows(combined, routed_norm, eps, combined)
    if routed_up is not None:
        combined = matmul.plan_rows(routed_up, combined, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    if shared_down is None:
        out[:] = combined
    else:
        n_ff = shared_act.shape[1]
        ops.situ_rows(proj[:, shared_cols[0]:shared_cols[0] + n_ff], proj[:, shared_cols[0] + n_ff:shared_cols[1]],
                      shared_beta, shared_linear_beta, shared_act)
        sd = matmul.plan_rows(shared_down, shared_act, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
        for i in range(out.shape[1]):
            out[0, i] = combined[0, i] + sd[0, i]


class SituFFN(SituFFNTensors, DenseFFN):
    with_residual = Piece.with_residual     # DenseFFN's one-call residual path is SwiGLU's; __call__ has situ's

    def __post_init__(self):
        super().__post_init__()
        self.one_token_call = DirectCall(situ_ffn)

    def __call__(self, h, stepwise: bool) -> np.ndarray:
        if self.in_one_call(h):
            return self.one_token_call(np.ascontiguousarray(h, np.float32), self.one_token_fixed, F32(self.beta),
                                       F32(self.linear_beta), workers.one_call_counter()).copy()
        gate, up = self.gate_up(h, stepwise)
        return self.down(situ(gate, up, self.beta, self.linear_beta), stepwise)


class LatentMoE(LatentMoETensors, RoutedExperts):
    with_residual = Piece.with_residual     # RoutedExperts' one-call residual path is theirs; __call__ has this one's

    def __post_init__(self):
        # what reads the full-width input, one call (each matrix its own kernel's bits): router, routed_down, the
        # shared experts' gate and up
        shared = (self.shared.gate, self.shared.up) if self.shared is not None else ()
        self.inputs = MatrixGroup(self.router, *([self.routed_down] if self.routed_down else []), *shared)
        super().__post_init__()
        self.one_token_call = DirectCall(one_token_latent_moe)

    def _one_token_args(self):
        """one_token_latent_moe's arguments after h, where it applies: every plan with one_call (gate and up one plan,
        down another), no expert stack paged; else None."""
        group, shared, k = self.inputs.one_token_args(), self.shared, self.n_expert_used
        if group is None or len(self.gate_up.parts) != 1 or len(self.down_group.parts) != 1 or self.gate_up.paged \
                or self.down_group.paged:
            return None
        (idx, gate_up), (_, down) = self.gate_up.parts[0], self.down_group.parts[0]
        singles = [m.plan for m in (self.routed_up, shared and shared.down) if m]
        if not all(plan is not None and plan.one_call for plan in [gate_up, down] + singles):
            return None
        (inputs, where), starts = group
        gate_cols, up_cols = (np.array(gate_up.columns[idx.index(i)], np.int64) for i in (0, 1))
        routed_cols = np.array(starts[1:3] if self.routed_down else (-1, -1), np.int64)
        shared_cols = np.array((starts[-3], starts[-1]) if shared else (-1, -1), np.int64)
        _, slot_pos, groups = self.one_token_slots
        return (inputs, where, np.empty((1, int(starts[-1])), np.float32), routed_cols, shared_cols, self.probs_bias,
                self.weights_norm, self.weights_scale, gate_up.call_args(k), gate_cols, up_cols, down.call_args(k),
                slot_pos, groups, np.empty((1, self.gate.n_cols), np.float32),
                np.empty((k, self.gate.n_rows), np.float32), F32(self.beta), F32(self.linear_beta),
                np.zeros(0, np.float32) if self.routed_norm is None else self.routed_norm, F32(self.eps),
                self.routed_up.plan.call_args(1) if self.routed_up else None,
                shared.down.plan.call_args(1) if shared else None,
                np.empty((1, shared.gate.n_rows if shared else 0), np.float32),
                F32(shared.beta if shared else 1.0), F32(shared.linear_beta if shared else 0.0))

    def route(self, h: np.ndarray, stepwise: bool, logits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(T, n_embd) (or the router's logits) -> experts (T, k) int64 in descending order of selection, weights
        (T, k) float32."""
        experts = np.empty((len(h), self.n_expert_used), np.int64)
        weights = np.empty((len(h), self.n_expert_used), np.float32)
        route_sigmoid_rows(self.router(h, stepwise) if logits is None else logits, self.probs_bias,
                           self.n_expert_used, self.weights_norm, self.weights_scale, experts, weights)
        return experts, weights

    def __call__(self, h: np.ndarray, stepwise: bool) -> np.ndarray:
        if self.in_one_call(h):
            k = self.n_expert_used
            out = np.empty((1, h.shape[1]), np.float32)
            self.one_token_call(np.ascontiguousarray(h, np.float32), self.one_token_fixed, np.empty((1, k), np.int64),
                                np.empty((1, k), np.float32), workers.one_call_counter(), out)
            return out
        logits, *rest = self.inputs(h, stepwise)
        routed_in = h if self.routed_down is None else rest.pop(0)
        experts, weights = self.route(h, stepwise, logits)
        rows, sorted_experts, slot_pos, used, groups = self.slots(experts)
        gate, up = self.gate_up.run_experts(routed_in, rows, used, groups)
        (down,) = self.down_group.run_experts(situ(gate, up, self.beta, self.linear_beta), None, used, groups)
        out = np.empty((len(h), down.shape[1]), np.float32)
        combine_rows(down, NO_BIAS, sorted_experts, slot_pos, weights, out)
        if self.routed_norm is not None:
            out = ops.rms_norm(out, self.routed_norm, self.eps)
        if self.routed_up is not None:
            out = self.routed_up(out, stepwise)
        if self.shared is None:
            return out
        return out + self.shared.down(situ(rest[0], rest[1], self.shared.beta, self.shared.linear_beta), stepwise)
