"""qwen35moe's FFN: the routed experts plus a shared expert, a dense SwiGLU FFN whose output is scaled per token
by sigmoid(gate . h) (llama.cpp's qwen35moe build_layer_ffn: ffn_moe_out + ffn_shexp * sigmoid(shared gate))."""

import numpy as np

from ggtools.runtime.kernels import ops
from ggtools.runtime.target.ffn.dense import DenseFFN
from ggtools.runtime.target.ffn.moe import RoutedExperts, Routing
from ggtools.runtime.weights import Matrix


class SharedExpertMoE:
    def __init__(self, routed: RoutedExperts, shared: DenseFFN, shared_gate: Matrix):
        self.routed, self.shared, self.shared_gate = routed, shared, shared_gate

    @classmethod
    def load(cls, w, hp, i: int, routing: Routing = Routing()) -> "SharedExpertMoE":
        """Layer i's routed experts and blk.i.ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp (one row)."""
        p = f"blk.{i}."
        shared = DenseFFN(gate=w.matrix(p + "ffn_gate_shexp.weight", hp.n_embd, hp.n_ff_shexp),
                          up=w.matrix(p + "ffn_up_shexp.weight", hp.n_embd, hp.n_ff_shexp),
                          down=w.matrix(p + "ffn_down_shexp.weight", hp.n_ff_shexp, hp.n_embd))
        return cls(RoutedExperts.load(w, hp, i, routing=routing), shared,
                   w.matrix(p + "ffn_gate_inp_shexp.weight", hp.n_embd, 1))

    def __call__(self, h: np.ndarray, stepwise: bool) -> np.ndarray:
        gate = self.shared_gate(h, stepwise)
        ops.sigmoid_rows(gate, gate)
        return self.routed(h, stepwise) + self.shared(h, stepwise) * gate
