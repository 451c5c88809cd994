"""The dense SwiGLU FFN: down(silu(gate(h)) * up(h))."""

from dataclasses import dataclass

import numpy as np

from ggtools.runtime.kernels import ops
from ggtools.runtime.weights import Matrix, MatrixGroup


@dataclass
class DenseFFN:
    gate: Matrix
    up: Matrix
    down: Matrix

    def __post_init__(self):
        self.gate_up = MatrixGroup(self.gate, self.up)

    @classmethod
    def load(cls, w, hp, i: int) -> "DenseFFN":
        """Layer i's FFN tensors (blk.i.ffn_{gate,up,down}) from a WeightFile."""
        p = f"blk.{i}."
        return cls(gate=w.matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff),
                   up=w.matrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff),
                   down=w.matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd))

    def __call__(self, h, stepwise: bool) -> np.ndarray:
        gate, up = self.gate_up(h, stepwise)
        return self.down(ops.swiglu(gate, up), stepwise)
