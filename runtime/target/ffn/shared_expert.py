"""qwen35moe's FFN on numba: the routed experts plus a shared expert, a dense SwiGLU FFN whose output is scaled per
token by sigmoid(gate . h) (llama.cpp's qwen35moe build_layer_ffn: ffn_moe_out + ffn_shexp * sigmoid(shared gate))."""

import numpy as np

from ggtools.runtime.kernels import ops
from ggtools.runtime.target.pieces import SharedExpertTensors


class SharedExpertMoE(SharedExpertTensors):
    def __call__(self, h: np.ndarray, stepwise: bool) -> np.ndarray:
        gate = self.shared_gate(h, stepwise)
        ops.sigmoid_rows(gate, gate)
        return self.routed(h, stepwise) + self.shared(h, stepwise) * gate
