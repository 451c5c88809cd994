"""The dense SwiGLU FFN on numba: down(silu(gate(h)) * up(h)), gate and up in one kernel call."""

import numpy as np
from numba import njit

from ggtools.runtime.kernels import matmul, ops, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args
from ggtools.runtime.kernels.ggmlmath import EXACT
from ggtools.runtime.model.ffn.one_call import OneCallFFN
from ggtools.runtime.model.pieces import DenseFFNTensors
from ggtools.runtime.weights import MatrixGroup


@njit(**EXACT)
def swiglu_ffn(h, gate_up, gate_cols, up_cols, down, act, counter):
    """DenseFFN on one token h: gate and up (one plan), SwiGLU into act, down. Returns down's out. gate_up, down:
    MatmulPlan.call_args for one row."""
    gu = matmul.plan_rows(gate_up, h, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)
    ops.swiglu_rows(gu[:, gate_cols[0]:gate_cols[1]], gu[:, up_cols[0]:up_cols[1]], act)
    return matmul.plan_rows(down, act, False, matmul.FIRST_EXPERT, matmul.ONE_ROW_GROUP, counter)


@njit(**EXACT)
def one_token_ffn(x, norm, eps, h, ffn, counter, out):
    """out = x + DenseFFN(rms_norm(x) * norm) on one token in one call, with the same kernels in the same order: the
    norm, swiglu_ffn (ffn: its arguments after h as a FixedArgs), the residual."""
    ops.rms_norm_rows(x, norm, eps, h)
    dn = swiglu_ffn(h, *ffn.args, counter)
    for i in range(out.shape[1]):
        out[0, i] = dn[0, i] + x[0, i]


class DenseFFN(DenseFFNTensors, OneCallFFN):
    def __post_init__(self):
        self.gate_up = MatrixGroup(self.gate, self.up)
        self.one_token = self._one_token_args()
        self.one_token_fixed = None if self.one_token is None else fixed_args(self.one_token)
        self.one_token_call = DirectCall(one_token_ffn)

    def _one_token_args(self):
        """one_token_ffn's plans, column ranges and scratch, where it applies: gate and up one plan, down another,
        both with one_call; else None."""
        if len(self.gate_up.parts) != 1 or self.down.plan is None:
            return None
        (idx, gate_up), down = self.gate_up.parts[0], self.down.plan
        if not (gate_up.one_call and down.one_call):
            return None
        gate_cols, up_cols = (np.array(gate_up.columns[idx.index(i)], np.int64) for i in (0, 1))
        act = np.empty((1, self.gate.n_rows), np.float32)
        return gate_up.call_args(1), gate_cols, up_cols, down.call_args(1), act

    def __call__(self, h, stepwise: bool) -> np.ndarray:
        gate, up = self.gate_up(h, stepwise)
        return self.down(ops.swiglu(gate, up), stepwise)

    def with_residual(self, ops_, x, norm, eps, stepwise: bool) -> np.ndarray:
        if self.in_one_call(x):
            out = np.empty_like(x)
            self.one_token_call(x, norm, np.float32(eps), np.empty_like(x), self.one_token_fixed,
                                workers.one_call_counter(), out)
            return out
        return super().with_residual(ops_, x, norm, eps, stepwise)
