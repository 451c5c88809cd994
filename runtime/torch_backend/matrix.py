"""DeviceMatrix: a weight matrix (or a stack of experts) kept as its GGUF blocks, uint8 on the device, one copy.

In float32 a product is llama.cpp's CPU product bit for bit (ggml_matmul.py: the input rounded to the weight
type's vec_dot type, integer block dots, its fma chains and lane sums). In bf16 / f16 (a GPU's fast path) each
product dequantizes the rows it needs (dequant.py) in chunks of at most CHUNK_VALUES values, converts them to the
compute dtype and multiplies with torch's matmul: nothing is rounded as llama.cpp rounds it. Nothing dequantized
is kept. On the CPU the blocks are the mapped file's own pages (no copy at all); on a GPU they are copied there
once, at load.
"""

import warnings

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES

from ggtools.runtime.torch_backend.dequant import dequantize
from ggtools.runtime.torch_backend.ggml_matmul import ExactProduct

CHUNK_VALUES = 1 << 24      # dequantized values per chunk of a product (64 MiB of float32)


class DeviceMatrix:
    def __init__(self, name: str, qtype, n_rows: int, n_cols: int, blocks: torch.Tensor, n_expert: int,
                 dtype: torch.dtype):
        """blocks: uint8 (n_expert * n_rows, row_bytes) on the device; dtype: what products compute in."""
        self.name, self.qtype, self.n_rows, self.n_cols, self.n_expert = name, qtype, n_rows, n_cols, n_expert
        self.blocks, self.dtype = blocks, dtype
        self.exact = ExactProduct(qtype, n_rows, n_cols) if dtype == torch.float32 else None

    @classmethod
    def from_buffer(cls, name, qtype, n_rows: int, n_cols: int, buf: np.ndarray, offset: int, n_expert: int = 1,
                    *, device: torch.device, dtype: torch.dtype) -> "DeviceMatrix":
        """The matrix at buf[offset:] (buf: a whole mapped file as uint8), as weights.WeightFile asks for it."""
        qk, block_bytes = GGML_QUANT_SIZES[qtype]
        row_bytes = n_cols // qk * block_bytes
        data = buf[offset:offset + n_expert * n_rows * row_bytes]
        with warnings.catch_warnings():     # a read-only mapping: torch never writes to weights
            warnings.simplefilter("ignore", UserWarning)
            blocks = torch.from_numpy(data).view(n_expert * n_rows, row_bytes)
        return cls(name, qtype, n_rows, n_cols, blocks.to(device), n_expert, dtype)

    def _chunks(self, expert: int, step: int):
        """(first row, that chunk's uint8 rows) over the matrix, or over expert `expert` of a stack."""
        first = expert * self.n_rows
        for r in range(0, self.n_rows, step):
            yield r, self.blocks[first + r:first + min(self.n_rows, r + step)]

    def product(self, x: torch.Tensor, expert: int | None = None, stepwise: bool = False) -> torch.Tensor:
        """x (T, n_cols) -> x W^T (T, n_rows), W the matrix (or expert `expert` of the stack: its rows are dotted
        one at a time, as llama.cpp's mul_mat_id does). stepwise: every row as llama.cpp computes a one-token
        batch (numba's; only float32 products of float weights change)."""
        out = torch.empty((x.shape[0], self.n_rows), dtype=self.dtype, device=x.device)
        if self.exact is not None:
            prepared = self.exact.prepare(x.float())
            for r, rows in self._chunks(expert or 0, self.exact.rows_per_chunk(len(x))):
                out[:, r:r + len(rows)] = self.exact.dot(prepared, rows, stepwise, expert is not None)
            return out
        x = x.to(self.dtype)
        for r, rows in self._chunks(expert or 0, max(1, CHUNK_VALUES // self.n_cols)):
            out[:, r:r + len(rows)] = x @ dequantize(self.qtype, rows, self.n_cols).to(self.dtype).T
        return out

    def __call__(self, x: torch.Tensor, stepwise: bool = False) -> torch.Tensor:
        return self.product(x, stepwise=stepwise)

    def rows(self, ids) -> torch.Tensor:
        """Dequantized rows `ids` (embedding lookup) in the compute dtype."""
        ids = torch.as_tensor(np.asarray(ids, np.int64), device=self.blocks.device)
        return dequantize(self.qtype, self.blocks[ids], self.n_cols).to(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def __repr__(self):
        return f"DeviceMatrix({self.name!r}, {self.qtype.name}, {self.n_rows}x{self.n_cols}, {self.blocks.device})"


class DeviceGroup:
    """Matrices applied to one input (Q, K, V; gate, up): a list of products (numba's MatrixGroup's interface)."""

    def __init__(self, *matrices: DeviceMatrix):
        self.matrices = matrices

    def __call__(self, x: torch.Tensor, stepwise: bool = False) -> list[torch.Tensor]:
        return [m.product(x, stepwise=stepwise) for m in self.matrices]
