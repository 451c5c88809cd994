"""The numba backend: the runtime's ops on the CPU, computed as llama.cpp's CPU backend computes them (kernels/,
the numba pieces under target/ and the drafter's attention). The default backend of TargetModel and Drafter."""

from types import SimpleNamespace

import numpy as np

from ggtools.runtime.drafter import attention as draft_attention
from ggtools.runtime.drafter.draft_kv import host_zeros
from ggtools.runtime.kernels import ops, workers
from ggtools.runtime.model.attn_residual import AttnResidual
from ggtools.runtime.model.ffn.dense import DenseFFN
from ggtools.runtime.model.ffn.latent_moe import LatentMoE, SituFFN
from ggtools.runtime.model.ffn.moe import RoutedExperts
from ggtools.runtime.model.ffn.shared_expert import SharedExpertMoE
from ggtools.runtime.model.kvcache import HOST_ARRAYS
from ggtools.runtime.model.mixers.attention import Attention
from ggtools.runtime.model.mixers.gated_delta_net import GatedDeltaNet
from ggtools.runtime.model.mixers.kda import KDA
from ggtools.runtime.model.mixers.mla import MLA
from ggtools.runtime.weights import MatrixGroup, WeightFile


# the numba classes of the pieces the architecture table names (target/archs.py)
PIECES = SimpleNamespace(Attention=Attention, GatedDeltaNet=GatedDeltaNet, DenseFFN=DenseFFN,
                         RoutedExperts=RoutedExperts, SharedExpertMoE=SharedExpertMoE,
                         KDA=KDA, MLA=MLA, SituFFN=SituFFN, LatentMoE=LatentMoE, AttnResidual=AttnResidual)


class NumbaOps:
    """Arrays are numpy float32 on the host; matrices are weights.Matrix (dequantized inside the matmul kernels)."""

    name = "numba"
    device = "cpu"
    dtype = "f32"
    pieces = PIECES
    rms_norm = staticmethod(ops.rms_norm)
    swiglu = staticmethod(ops.swiglu)
    norm_rope = staticmethod(draft_attention.norm_rope)
    draft_attention = staticmethod(draft_attention.attention)
    zeros_like = staticmethod(np.zeros_like)
    kv_zeros = staticmethod(host_zeros)
    arrays = HOST_ARRAYS
    group = MatrixGroup

    def __init__(self, threads: int | None = None):
        """threads: worker threads (process-wide, default all cores)."""
        self.threads = (workers.set_threads(threads) if threads else workers.pool()).n_threads

    @staticmethod
    def open_weights(path) -> WeightFile:
        return WeightFile(path)

    @staticmethod
    def vector(x: np.ndarray) -> np.ndarray:
        return x

    @staticmethod
    def tables(rope: tuple) -> tuple:
        return rope

    @staticmethod
    def empty(shape) -> np.ndarray:
        return np.empty(shape, np.float32)

    @staticmethod
    def host(x: np.ndarray) -> np.ndarray:
        return x
