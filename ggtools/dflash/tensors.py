"""TensorJob: one output tensor of a conversion (source, GGUF name, type, why), and its encoding in row chunks.

Encoding follows the reference converters' value paths: sources widen exactly to float32 (BF16, F16) or
round to it (F64); then F32 is stored as is, F16 by numpy's round-to-nearest-even cast (what both converters
use; values beyond ±65504 become ±inf and are counted as overflow), BF16 and Q8_0 by ggtools.quants
(bit-exact with ggml and gguf-py). `via_f16` stores a value after a round trip through F16 (lucebox's
converter widens its F16-narrowed BF16 norms back to F32). A DerivedTensor stands in for a source whose values
a converter computes (DSpark's d2t as absolute ids, I64; a zero bias): small, held in memory, stored as they are.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools.dflash.safetensors import SourceTensor, TensorRows
from ggtools.quants import CHUNK_VALUES, quantize, row_bytes


@dataclass
class DerivedTensor(TensorRows):
    """Values a converter computes from the checkpoint (a source in the shape of SourceTensor)."""
    name: str               # what it was derived from, for messages
    path: str
    values: np.ndarray      # numpy order, int64 or float32

    @property
    def dtype(self) -> str:
        return "I64" if self.values.dtype == np.int64 else "F32"

    @property
    def ggml_type(self) -> T:
        return T.I64 if self.values.dtype == np.int64 else T.F32

    @property
    def shape(self) -> tuple:
        return tuple(self.values.shape)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        return self.values.reshape(-1, self.row_length)[start:stop]

    def read_all(self) -> np.ndarray:
        return self.values


@dataclass
class TensorJob:
    src: SourceTensor | DerivedTensor
    name: str                              # GGUF tensor name
    dst_type: T
    reason: str
    via_f16: bool = False
    permute_head_dim: int | None = None    # de-interleave rope rows per head (rope_is_neox_style = false)
    interleave_head_dim: int | None = None  # interleave each head's halves (LlamaModel.permute: HF q/k -> ggml RoPE)

    @property
    def ne(self) -> tuple:
        return tuple(reversed(self.src.shape))

    @property
    def nbytes(self) -> int:
        return row_bytes(self.dst_type, self.src.row_length) * self.src.n_rows

    @property
    def n_elements(self) -> int:
        return self.src.n_elements

    @property
    def checks_f16_range(self) -> bool:
        return self.dst_type == T.F16 or self.via_f16


class Encoded(NamedTuple):
    data: np.ndarray
    overflow: int           # finite source values that became inf in F16
    nonfinite: int          # source values that are NaN or inf


def encode_chunks(job: TensorJob, chunk_values: int = CHUNK_VALUES) -> Iterator[Encoded]:
    """Each chunk of rows encoded, in order; together the tensor's data."""
    src = job.src
    head_dim, order = _row_order(job)
    if head_dim and len(src.shape) == 1:
        values = src.read_all()[order(src.n_elements, head_dim)]
        yield _encode(values.reshape(1, -1), job)
        return
    step = max(1, chunk_values // max(1, src.row_length))
    if head_dim:
        step = max(1, step // head_dim) * head_dim
    for start in range(0, src.n_rows, step):
        stop = min(src.n_rows, start + step)
        rows = src.read_rows(start, stop)
        if head_dim:
            rows = rows[order(stop - start, head_dim)]
        yield _encode(rows, job)


def _row_order(job: TensorJob):
    """(head size, the order of a run of whole heads' rows) of a job that reorders rows per head, else (None, None)."""
    if job.permute_head_dim:
        return job.permute_head_dim, _head_order
    if job.interleave_head_dim:
        return job.interleave_head_dim, _interleaved_order
    return None, None


def _head_order(n: int, head_dim: int) -> np.ndarray:
    """Per head of head_dim entries: the even entries, then the odd ones (interleaved rope -> NeoX)."""
    return np.arange(n).reshape(-1, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


def _interleaved_order(n: int, head_dim: int) -> np.ndarray:
    """Per head: entry 2i + h is the h-th half's entry i (llama.cpp's LlamaModel.permute, rotate-half rows -> ggml's
    interleaved RoPE pairs)."""
    return np.arange(n).reshape(-1, 2, head_dim // 2).transpose(0, 2, 1).reshape(-1)


def _encode(values: np.ndarray, job: TensorJob) -> Encoded:
    if job.dst_type == T.I64:
        return Encoded(np.ascontiguousarray(values, dtype="<i8").view(np.uint8), 0, 0)
    overflow = 0
    nonfinite = values.size - int(np.count_nonzero(np.isfinite(values)))
    if job.checks_f16_range:
        with np.errstate(over="ignore"):
            half = values.astype("<f2")
        overflow = int(np.count_nonzero(np.isinf(half) & np.isfinite(values)))
        if job.dst_type == T.F16:
            return Encoded(half.view(np.uint8), overflow, nonfinite)
        values = half.astype(np.float32)
    if job.dst_type == T.F32:
        return Encoded(np.ascontiguousarray(values, dtype="<f4").view(np.uint8), overflow, nonfinite)
    return Encoded(quantize(job.dst_type, values), overflow, nonfinite)
