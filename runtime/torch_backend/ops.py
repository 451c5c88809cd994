"""TorchOps: the torch backend's side of the model description (the interface numba_backend.NumbaOps has).

Activations are torch tensors on the device in the compute dtype (float32 on the CPU; bfloat16 or float16 on a
GPU by default); matrices are DeviceMatrix (GGUF blocks on the device). In float32 every op is llama.cpp's CPU
arithmetic (ggml_math.py, ggml_matmul.py: the numba runtime's bits); in bfloat16 / float16 matmuls run in that
dtype and norms, softmax and attention in float32 with torch's functions (`numerics_note` in backends.py). The
target's KV cache, the recurrent states and the draft KV's stores are tensors on the device; logits come back
to the host (numpy float32) for the greedy choice and the draft chain.
"""

from types import SimpleNamespace

import numpy as np
import torch

from ggtools.runtime.errors import SettingsError
from ggtools.runtime.torch_backend import attention, tensor_math
from ggtools.runtime.torch_backend.delta_net import GatedDeltaNet
from ggtools.runtime.torch_backend.attn_residual import AttnResidual
from ggtools.runtime.torch_backend.ffn import DenseFFN, RoutedExperts, SharedExpertMoE
from ggtools.runtime.torch_backend.kimi_k3_ffn import LatentMoE, SituFFN
from ggtools.runtime.torch_backend.kimi_k3_mixers import KDA, MLA
from ggtools.runtime.torch_backend.matrix import DeviceGroup, DeviceMatrix
from ggtools.runtime.torch_backend.vectors import device_vector
from ggtools.runtime.weights import WeightFile

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
KV_DTYPES = {"f16": torch.float16, "f32": torch.float32}


class KVStore:
    """One layer's K or V rows of the draft KV on the device: rows written at any slots (cast to the store's
    type, as numpy assignment casts), read by index (attention.draft_attention)."""

    def __init__(self, data: torch.Tensor):
        self.data = data

    def __setitem__(self, index, rows):
        if isinstance(index, np.ndarray):
            index = torch.as_tensor(index, device=self.data.device)
        self.data[index] = (rows.data if isinstance(rows, KVStore) else rows).to(self.data.dtype)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index):
        return KVStore(self.data[index])

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


# the torch classes of the pieces the architecture table names (target/archs.py)
PIECES = SimpleNamespace(Attention=attention.Attention, GatedDeltaNet=GatedDeltaNet, DenseFFN=DenseFFN,
                         RoutedExperts=RoutedExperts, SharedExpertMoE=SharedExpertMoE,
                         KDA=KDA, MLA=MLA, SituFFN=SituFFN, LatentMoE=LatentMoE, AttnResidual=AttnResidual)


class TorchOps:
    name = "torch"
    pieces = PIECES
    rms_norm = staticmethod(tensor_math.rms_norm)
    swiglu = staticmethod(tensor_math.swiglu)
    norm_rope = staticmethod(tensor_math.norm_rope)
    draft_attention = staticmethod(attention.draft_attention)
    zeros_like = staticmethod(torch.zeros_like)
    group = DeviceGroup

    def __init__(self, device: str = "cpu", dtype: str | None = None, threads: int | None = None):
        """device: "cpu", "cuda" or "cuda:N"; dtype: "f32" (the default on the CPU), "bf16" (the default on a
        GPU) or "f16" (on the CPU too, slowly: it runs the GPU's code path); threads: torch's CPU threads
        (default: torch's own)."""
        try:
            self.torch_device = torch.device(device)
        except RuntimeError:
            self.torch_device = None
        if self.torch_device is None or self.torch_device.type not in ("cpu", "cuda"):
            raise SettingsError(f"--device {device!r}: expected cpu, cuda or cuda:N")
        if self.torch_device.type == "cuda":
            _check_cuda(self.torch_device, device)
        self.device = str(self.torch_device)
        self.dtype = dtype or ("f32" if self.torch_device.type == "cpu" else "bf16")
        if self.dtype not in DTYPES:
            raise SettingsError(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        self.compute_dtype = DTYPES[self.dtype]
        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        d = self.torch_device
        self.arrays = SimpleNamespace(
            cache_zeros=lambda shape, kv_type: torch.zeros(shape, dtype=KV_DTYPES[kv_type], device=d),
            zeros=lambda shape: torch.zeros(shape, dtype=torch.float32, device=d), copy=torch.clone, cat=torch.cat)

    def open_weights(self, path) -> WeightFile:
        def make_matrix(*args):
            return DeviceMatrix.from_buffer(*args, device=self.torch_device, dtype=self.compute_dtype)
        return WeightFile(path, make_matrix=make_matrix)

    def kv_zeros(self, shape, kv_type: str) -> KVStore:
        return KVStore(torch.zeros(shape, dtype=KV_DTYPES[kv_type], device=self.torch_device))

    def vector(self, x: np.ndarray) -> torch.Tensor:
        return device_vector(x, self.torch_device)

    def tables(self, rope: tuple) -> tuple:
        return tuple(device_vector(t, self.torch_device) for t in rope)

    def empty(self, shape) -> torch.Tensor:
        return torch.empty(shape, dtype=self.compute_dtype, device=self.torch_device)

    @staticmethod
    def host(x: torch.Tensor) -> np.ndarray:
        return x.float().cpu().numpy()


def _check_cuda(device: torch.device, name: str) -> None:
    if not torch.cuda.is_available():
        raise SettingsError(f"--device {name}: torch {torch.__version__} sees no CUDA device on this machine")
    index = device.index or 0
    if index >= torch.cuda.device_count():
        raise SettingsError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
