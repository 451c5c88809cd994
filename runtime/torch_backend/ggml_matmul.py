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
- Q6_K, and Q4_K matrices llama.cpp repacks, against Q8_K blocks (kernels/kquant_dot.py): exact integer sums per
  256-value super-block, Q4_K's two fma chains (scales, mins) per weight row, Q6_K's 8 lanes and hsum8.
- F32 / F16 / BF16 and the other K-quants (decoded to float32, the input through Q8_K): tinyBLAS's 8 fma lanes and
  hsum8 for batches (K-quants always), ggml_vec_dot_f16 / f32's four 8-lane accumulators for one row, a
  stepwise batch, an expert's rows (mul_mat_id) and matrices tinyBLAS does not take; rows whose length leaves a
  remainder go through vec_dot's leftover loop.

The fma chains are a loop over the blocks (or steps of 8 / 32 values) with every input row and weight row of a
chunk in one tensor; chunks bound the integer lanes to about 2^24 values.
"""

import torch
from gguf import GGMLQuantizationType as T

from ggtools.runtime.kernels.matmul import Layout, Q4_0_REPACKED, MXFP4_REPACKED
from ggtools.runtime.torch_backend import ggml_math as gm
from ggtools.runtime.torch_backend.activation import BLOCK32, MIN_TYPES, quantize_q8, quantize_q8_k, round_input
from ggtools.runtime.torch_backend.dequant import block_values, dequantize, k_quant_ints

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

    def dot(self, prepared, rows: torch.Tensor, one_row: bool) -> torch.Tensor:
        """The prepared input (n_in rows) against weight rows `rows` (uint8 blocks) -> (n_in, len(rows)) float32."""
        if self.qtype in BLOCK32:
            return self._block32(prepared, rows)
        if self.layout.integer_kquant:
            return self._q4_k(prepared, rows) if self.qtype == T.Q4_K else self._q6_k(prepared, rows)
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
            return _fma_chain(sums, scales)
        # lanes[b, l, t, r] = sum_i wq[r, b, 4l + i] * xq[t, b, 4l + i]: exact integers
        g = n_blocks * 8
        lanes = torch.bmm(xq.reshape(n_in, g, 4).transpose(0, 1), wq.reshape(-1, g, 4).permute(1, 2, 0))
        lanes = lanes.reshape(n_blocks, 8, n_in, -1)
        scales = scales[:, None]
        if self.qtype == T.MXFP4:
            return _pairs(lanes, scales)
        out = gm.hsum8(_fma_chain(lanes, scales).movedim(0, -1))
        if wm is None:
            return out
        return out + _fma_chain(xs.T[:, :, None], wm.T[:, None, :].double())


    def _q4_k(self, prepared, rows: torch.Tensor) -> torch.Tensor:
        q8, xd = prepared
        w = k_quant_ints(T.Q4_K, rows)
        n_in, n_blocks, n_rows = len(q8), xd.shape[1], len(rows)
        # (blocks, 8 sub-blocks, n_in, rows): q4 . q8 over each 32-value sub-block, exact in float32
        dots = _small_int_dots(q8.reshape(n_in, n_blocks * 8, 32), w["values"].reshape(n_rows, n_blocks * 8, 32))
        dots = dots.reshape(n_blocks, 8, n_in, n_rows).long()
        isum = (dots * w["scales"].permute(1, 2, 0)[:, :, None].long()).sum(1)
        sub_sums = q8.reshape(n_in, n_blocks, 8, 32).sum(-1).long()            # the q8 sum of each sub-block
        imin = torch.einsum("tbj,rbj->btr", sub_sums, w["mins"].long())
        acc = _fma_chain(isum.float(), (xd.T[:, :, None] * w["d"].T[:, None, :]).double())
        acc_m = _fma_chain(imin.float(), (xd.T[:, :, None] * w["dmin"].T[:, None, :]).double())
        return acc - acc_m

    def _q6_k(self, prepared, rows: torch.Tensor) -> torch.Tensor:
        q8, xd = prepared
        w = k_quant_ints(T.Q6_K, rows)
        n_in, n_blocks, n_rows = len(q8), xd.shape[1], len(rows)
        # (blocks, 8 chunks of 32, 8 lanes, n_in, rows): values 4l..4l+3 of each chunk, exact in float32
        dots = _small_int_dots(q8.reshape(n_in, n_blocks * 64, 4), w["values"].reshape(n_rows, n_blocks * 64, 4))
        dots = dots.reshape(n_blocks, 8, 8, n_in, n_rows).long()
        scales = w["scales"].permute(1, 2, 0).long()                          # (blocks, 16, rows)
        lane_scales = scales.reshape(n_blocks, 8, 2, n_rows).repeat_interleave(4, 2)[:, :, :, None]  # lane l: 2k + l // 4
        lanes = (dots * lane_scales).sum(1)                                   # (blocks, 8, n_in, rows)
        bsums = q8.reshape(n_in, n_blocks, 16, 16).sum(-1).long().permute(1, 2, 0)   # (blocks, 16, n_in)
        offset = (bsums[:, :, :, None] * scales[:, :, None]).reshape(n_blocks, 8, 2, n_in, n_rows).sum(2)
        lanes = lanes - 32 * offset
        d = (xd.T[:, :, None] * w["d"].T[:, None, :]).double()[:, None]
        return gm.hsum8(_fma_chain(lanes.float(), d).movedim(0, -1))


def _small_int_dots(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (n_in, groups, k), w (rows, groups, k) float32 small integers -> (groups, n_in, rows), each sum exact."""
    return torch.bmm(x.transpose(0, 1), w.float().permute(1, 2, 0))


def _fma_chain(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """acc = fma(values[b], scales[b], acc) over b from acc = 0, float32 (values float32, scales float64 holding
    float32 values: the product is exact in float64; torch computes addcmul in float64 and rounds it once to the
    float32 output)."""
    acc = (values[0] * scales[0] + 0.0).float()
    for b in range(1, len(values)):
        torch.addcmul(acc, values[b], scales[b], out=acc)
    return acc


def _pairs(lanes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """ggml_vec_dot_mxfp4_q8_0 (AVX2): even and odd blocks in two accumulators, hsum8 of their sum, and a last
    odd block added as fma(d, its integer sum, total). lanes (blocks, 8, n_in, rows); scales (blocks, 1, n_in,
    rows)."""
    n_blocks = len(lanes)
    n_pairs = n_blocks // 2
    pair_shape = (n_pairs, 2) + lanes.shape[1:]
    acc = _fma_chain(lanes[:2 * n_pairs].reshape(pair_shape), scales[:2 * n_pairs].reshape(
        (n_pairs, 2) + scales.shape[1:]))
    total = gm.hsum8((acc[0] + acc[1]).movedim(0, -1))
    if n_blocks % 2:
        total = gm.fma(scales[-1, 0].float(), gm.hsum8(lanes[-1].movedim(0, -1)), total)
    return total
