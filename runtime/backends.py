"""Choosing the backend that runs a model: numba (the default, on the CPU) or torch (CPU or CUDA; an optional
extra). `make_ops` returns the ops object TargetModel (and through it the Drafter) runs with.

What an ops object provides (numba_backend.NumbaOps, torch_backend.ops.TorchOps):
- name, device, dtype, threads: what runs the model, for reports;
- pieces: the backend's classes of the pieces the architecture table names; open_weights(path): a WeightFile
  whose matrices this backend multiplies; group(*matrices): matrices applied to one input;
- rms_norm, swiglu, norm_rope, draft_attention: the drafter's and the model loop's ops;
- vector(numpy) / tables(rope) / empty(shape) / host(array): arrays to and from the backend;
- arrays (the target cache's and recurrent states' zeros / copy / cat), kv_zeros (the draft KV's stores),
  zeros_like (DFlash2's convolution).

numba, and torch in f32 (on the CPU or a GPU), compute llama.cpp's CPU arithmetic bit for bit; torch in bf16 or f16
does not (`numerics_note` says so in reports).
"""

from ggtools.runtime.errors import SettingsError
from ggtools.runtime.numba_backend import NumbaOps

BACKENDS = ("numba", "torch")
TORCH_EXTRA = "pip install 'ggtools[torch]'"


def numerics_note(backend: str, dtype: str) -> str:
    """'' for a backend and dtype that compute llama.cpp's CPU numerics (numba; torch in f32), else the words a
    report adds: in bf16 / f16 the torch backend multiplies in that dtype and rounds nothing as llama.cpp does."""
    if backend == "torch" and dtype != "f32":
        return f"{dtype} is not llama.cpp's arithmetic: tokens and tau can differ from it (--dtype f32 computes it)"
    return ""


def make_ops(backend: str = "numba", device: str | None = None, dtype: str | None = None,
             threads: int | None = None):
    """backend: "numba" or "torch"; device: "cpu", "cuda" or "cuda:N" (torch only); dtype: the compute dtype,
    "f32" on the CPU, "bf16" (default) or "f16" on a GPU (torch only); threads: CPU threads."""
    if backend == "numba":
        if device not in (None, "cpu") or dtype not in (None, "f32"):
            raise SettingsError("--device and --dtype other than cpu / f32 need --backend torch")
        return NumbaOps(threads)
    if backend != "torch":
        raise SettingsError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SettingsError(f"--backend torch needs torch, an optional extra: {TORCH_EXTRA}") from None
    from ggtools.runtime.torch_backend.ops import TorchOps
    return TorchOps(device or "cpu", dtype, threads)
