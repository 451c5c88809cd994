"""Products of input rows with weight rows kept as GGUF blocks, summed as llama.cpp's CPU backend sums them
(x86-64, AVX2 build: the numba runtime's kernels/matmul.py, bit for bit), in vectorized torch float32.

For a weight type, the input is rounded to its vec_dot type (activation.py) and the dot follows the kernel
matmul.Layout names for the matrix:

- 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) against Q8_0 / Q8_1 blocks: per block, 8 lanes each
  hold the exact integer dot of 4 consecutive values (one batched matmul of small integers: exact in float32 in
  any order); acc = fma(d_w * d_x, lanes, acc) over the blocks, then hsum8 ("lanes"), plus the fma chain of
  m_w * s_x for types with a min; MXFP4 sums even and odd blocks apart ("pairs"); Q4_0 and MXFP4 matrices llama.cpp
  repacks (rows a multiple of 8 on AVX2) chain one fma per block of the block's integer sum ("repacked"). These
  do not depend on the batch.
- Q4_K and Q6_K against Q8_K blocks on integers, as llama.cpp's kernels for each (kquant_dot.py).
- F32 / F16 / BF16 and the other K-quants (decoded to float32, the input through Q8_K): tinyBLAS's 8 fma lanes and
  hsum8 for batches (K-quants always), ggml_vec_dot_f16 / f32's four 8-lane accumulators for one row, a
  stepwise batch, an expert's rows (mul_mat_id) and matrices tinyBLAS does not take; rows whose length leaves a
  remainder go through vec_dot's leftover loop.

The fma chains are a loop over the blocks (or steps of 8 / 32 values) with every input row and weight row of a
chunk in one tensor; chunks bound the integer lanes to about 2^24 values.
"""

import torch
from gguf import GGMLQuantizationType as T

from ggtools.runtime.kernels.kquant_dot import rows_mode
from ggtools.runtime.kernels.matmul import Layout, Q4_0_REPACKED, MXFP4_REPACKED
from ggtools.runtime.torch_backend import ggml_math as gm
from ggtools.runtime.torch_backend.ggml_math import fma_chain
from ggtools.runtime.torch_backend.activation import BLOCK32, MIN_TYPES, quantize_q8, quantize_q8_k, round_input
from ggtools.runtime.torch_backend import kquant_dot
from ggtools.runtime.torch_backend.dequant import block_values, dequantize

LANES_VALUES = 1 << 24      # input rows x weight rows x row length per chunk of an exact product
FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
HALF_TYPES = frozenset({T.F16, T.BF16})     # weights and their rounded inputs multiply exactly in float32


class ExactProduct:
    """One matrix's geometry and the summation order llama.cpp's CPU backend uses for it."""

    def __init__(self, qtype, n_rows: int, n_cols: int):
        self.layout = Layout(qtype, n_rows, n_cols)
        self.qtype, self.n_cols = self.layout.qtype, n_cols
        self.repacked = self.layout.kernel_id in (Q4_0_REPACKED, MXFP4_REPACKED)

    def prepare(self, x: torch.Tensor):
        """x (T, n_cols) float32 -> the input as this type's dot reads it."""
        if self.qtype in BLOCK32:
            return quantize_q8(x, with_sums=self.qtype in MIN_TYPES)
        if self.layout.integer_kquant:
            return quantize_q8_k(x)
        return round_input(self.qtype, x)

    def rows_per_chunk(self, n_in: int) -> int:
        return max(1, LANES_VALUES // (n_in * self.n_cols))

    def one_row(self, n_in: int, stepwise: bool, expert: bool) -> bool:
        """Whether llama.cpp dots these rows with vec_dot's one-row layout (numba's MatmulPlan.run)."""
        return n_in == 1 or stepwise or expert or not self.layout.tinyblas

    def dot(self, prepared, rows: torch.Tensor, stepwise: bool, expert: bool) -> torch.Tensor:
        """The prepared input (n_in rows) against weight rows `rows` (uint8 blocks) -> (n_in, len(rows)) float32;
        stepwise: every row as a one-token batch; expert: the rows mul_mat_id routes to one expert."""
        if self.qtype in BLOCK32:
            return self._block32(prepared, rows)
        if self.layout.integer_kquant:
            return kquant_dot.product(self.layout, prepared, rows, rows_mode(stepwise, expert))
        one_row = self.one_row(len(prepared), stepwise, expert)
        w = dequantize(self.qtype, rows, self.n_cols)
        one_row_structure = self.qtype in FLOAT_TYPES and one_row
        width = 32 if one_row_structure else 8
        x = prepared[:, None]
        exact = self.qtype in HALF_TYPES
        if self.n_cols % width:
            return gm.dot_one_row(w, x, f16_tail=self.qtype != T.F32, exact_products=exact)
        return gm.dot_4x8(w, x, exact) if one_row_structure else gm.dot_lanes8(w, x, exact)

    def _block32(self, prepared, rows: torch.Tensor) -> torch.Tensor:
        xq, xd, xs = prepared
        wq, wd, wm = block_values(self.qtype, rows)
        n_in, n_blocks = xd.shape
        # d_w * d_x (blocks, n_in, rows), rounded to float32 and held in float64 for the fma chains
        scales = (xd.T[:, :, None] * wd.T[:, None, :]).double()
        if self.repacked:
            sums = torch.bmm(xq.transpose(0, 1), wq.permute(1, 2, 0))  # (blocks, n_in, rows) exact integers
            return fma_chain(sums, scales)
        # lanes[b, l, t, r] = sum_i wq[r, b, 4l + i] * xq[t, b, 4l + i]: exact integers
        g = n_blocks * 8
        lanes = torch.bmm(xq.reshape(n_in, g, 4).transpose(0, 1), wq.reshape(-1, g, 4).permute(1, 2, 0))
        lanes = lanes.reshape(n_blocks, 8, n_in, -1)
        scales = scales[:, None]
        if self.qtype == T.MXFP4:
            return _pairs(lanes, scales)
        out = gm.hsum8(fma_chain(lanes, scales).movedim(0, -1))
        if wm is None:
            return out
        return out + fma_chain(xs.T[:, :, None], wm.T[:, None, :].double())


def _pairs(lanes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """ggml_vec_dot_mxfp4_q8_0 (AVX2): even and odd blocks in two accumulators, hsum8 of their sum, and a last
    odd block added as fma(d, its integer sum, total). lanes (blocks, 8, n_in, rows); scales (blocks, 1, n_in,
    rows)."""
    n_blocks = len(lanes)
    n_pairs = n_blocks // 2
    pair_shape = (n_pairs, 2) + lanes.shape[1:]
    acc = fma_chain(lanes[:2 * n_pairs].reshape(pair_shape), scales[:2 * n_pairs].reshape(
        (n_pairs, 2) + scales.shape[1:]))
    total = gm.hsum8((acc[0] + acc[1]).movedim(0, -1))
    if n_blocks % 2:
        total = gm.fma(scales[-1, 0].float(), gm.hsum8(lanes[-1].movedim(0, -1)), total)
    return total
