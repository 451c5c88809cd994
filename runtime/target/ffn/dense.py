"""The dense SwiGLU FFN on numba: down(silu(gate(h)) * up(h)), gate and up in one kernel call."""

import numpy as np

from ggtools.runtime.kernels import ops
from ggtools.runtime.target.pieces import DenseFFNTensors
from ggtools.runtime.weights import MatrixGroup


class DenseFFN(DenseFFNTensors):
    def __post_init__(self):
        self.gate_up = MatrixGroup(self.gate, self.up)

    def __call__(self, h, stepwise: bool) -> np.ndarray:
        gate, up = self.gate_up(h, stepwise)
        return self.down(ops.swiglu(gate, up), stepwise)
