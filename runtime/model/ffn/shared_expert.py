"""qwen35moe's FFN on numba: the routed experts plus a shared expert, a dense SwiGLU FFN whose output is scaled per
token by sigmoid(gate . h) (llama.cpp's qwen35moe build_layer_ffn: ffn_moe_out + ffn_shexp * sigmoid(shared gate))."""

import numpy as np
from numba import njit

from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.model.ffn.dense import swiglu_ffn
from ggtools.runtime.model.ffn.moe import one_token_experts
from ggtools.runtime.model.ffn.one_call import OneCallFFN
from ggtools.runtime.model.pieces import SharedExpertTensors


@njit(**EXACT)
def one_token_shared_moe(x, norm, eps, h, fixed, experts, weights, counter, out):
    """out = x + SharedExpertMoE(rms_norm(x) * norm) on one token in one call, with the same kernels as the general
    path: the norm, the routed experts (one_token_experts), the shared expert (swiglu_ffn), its gate (a one-row plan)
    through sigmoid, routed + shared * gate, the residual. fixed: (RoutedExperts.one_token, DenseFFN.one_token,
    the gate's MatmulPlan.call_args for one row) as a FixedArgs."""
    routed, shared, shared_gate = fixed.args
    ops.rms_norm_rows(x, norm, eps, h)
    one_token_experts(h, False, norm, eps, h, routed, experts, weights, counter, out)
    dn = swiglu_ffn(h, *shared, counter)
    gate = matmul.plan_rows(shared_gate, h, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    ops.sigmoid_rows(gate, gate)
    for i in range(out.shape[1]):
        out[0, i] = (out[0, i] + dn[0, i] * gate[0, 0]) + x[0, i]


class SharedExpertMoE(SharedExpertTensors, OneCallFFN):
    def __post_init__(self):
        gate = self.shared_gate.plan
        self.one_token = self.one_token_fixed = None
        if self.routed.one_token and self.shared.one_token and gate is not None and gate.one_call:
            self.one_token = gate.call_args(1)
            self.one_token_fixed = fixed_args((self.routed.one_token, self.shared.one_token, self.one_token))
        self.one_token_call = DirectCall(one_token_shared_moe)

    def __call__(self, h: np.ndarray, stepwise: bool) -> np.ndarray:
        gate = self.shared_gate(h, stepwise)
        ops.sigmoid_rows(gate, gate)
        return self.routed(h, stepwise) + self.shared(h, stepwise) * gate

    def with_residual(self, ops_, x, norm, eps, stepwise: bool) -> np.ndarray:
        if self.in_one_call(x):
            k = self.routed.n_expert_used
            out = np.empty_like(x)
            self.one_token_call(x, norm, np.float32(eps), np.empty_like(x), self.one_token_fixed,
                                np.empty((1, k), np.int64), np.empty((1, k), np.float32), workers.one_call_counter(),
                                out)
            return out
        return super().with_residual(ops_, x, norm, eps, stepwise)
