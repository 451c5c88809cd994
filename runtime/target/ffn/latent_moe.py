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
from numba import njit

from ggtools.runtime.kernels import ops
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.target.ffn.dense import DenseFFN
from ggtools.runtime.target.ffn.moe import RoutedExperts, combine_rows, normalize_and_scale, top_k
from ggtools.runtime.target.kimi_k3_pieces import LatentMoETensors, SituFFNTensors
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


def situ(gate: np.ndarray, up: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    out = np.empty((len(gate), gate.shape[1]), np.float32)
    ops.situ_rows(gate, up, F32(beta), F32(linear_beta), out)
    return out


class SituFFN(SituFFNTensors, DenseFFN):
    def _one_token_args(self):
        return None         # situ, not SwiGLU: DenseFFN's one-call path does not apply

    def __call__(self, h, stepwise: bool) -> np.ndarray:
        gate, up = self.gate_up(h, stepwise)
        return self.down(situ(gate, up, self.beta, self.linear_beta), stepwise)


class LatentMoE(LatentMoETensors, RoutedExperts):
    def __post_init__(self):
        super().__post_init__()
        # what reads the full-width input, one call (each matrix its own kernel's bits): router, routed_down, the
        # shared experts' gate and up
        shared = (self.shared.gate, self.shared.up) if self.shared is not None else ()
        self.inputs = MatrixGroup(self.router, *([self.routed_down] if self.routed_down else []), *shared)

    def _one_token_args(self):
        return None         # sigmoid routing, situ, latent projections: RoutedExperts' one-call path does not apply

    def route(self, h: np.ndarray, stepwise: bool, logits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(T, n_embd) (or the router's logits) -> experts (T, k) int64 in descending order of selection, weights
        (T, k) float32."""
        experts = np.empty((len(h), self.n_expert_used), np.int64)
        weights = np.empty((len(h), self.n_expert_used), np.float32)
        route_sigmoid_rows(self.router(h, stepwise) if logits is None else logits, self.probs_bias,
                           self.n_expert_used, self.weights_norm, self.weights_scale, experts, weights)
        return experts, weights

    def __call__(self, h: np.ndarray, stepwise: bool) -> np.ndarray:
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
