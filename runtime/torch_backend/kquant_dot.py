"""Q4_K and Q6_K products on integers in torch, bit for bit with the numba kernels (kernels/kquant_dot.py, whose
docstring says which llama.cpp kernel takes which rows and how each sums): repacked Q4_K through the q4_K 8x8
gemv / gemm, other Q4_K and Q6_K through vec_dot, or the tiled kernel for 8 rows or more.

The integer sums are batched matmuls of small integers held in float32 (each product sum stays below 2^24, so
exact), combined with their scales in int64; the float steps are the same fma chains over the super-blocks.
"""

import torch
from gguf import GGMLQuantizationType as T

from ggtools.runtime.kernels.kquant_dot import Q4_K_REPACKED, ROWS_MATMUL, ROWS_STEPWISE, TILED_MIN_ROWS
from ggtools.runtime.torch_backend import ggml_math as gm
from ggtools.runtime.torch_backend.ggml_math import fma_chain
from ggtools.runtime.torch_backend.dequant import k_quant_ints


def product(layout, prepared, rows: torch.Tensor, mode: int) -> torch.Tensor:
    """Input rows prepared by activation.quantize_q8_k ((n_in, blocks, 256) integers, (n_in, blocks) d) against
    weight rows `rows` of layout's matrix, as llama.cpp runs rows in `mode` (kquant_dot.ROWS_*)."""
    q8, xd = prepared
    w = k_quant_ints(layout.qtype, rows)
    n_in = len(q8)
    if layout.kernel_id == Q4_K_REPACKED:
        gemm_rows = n_in // 4 * 4 if mode == ROWS_MATMUL and n_in > 3 else 0
        parts = [(q8[:gemm_rows], xd[:gemm_rows], True), (q8[gemm_rows:], xd[gemm_rows:], False)]
        return torch.cat([_q4_k_repacked(q, d, w, per_64) for q, d, per_64 in parts if len(q)])
    if mode != ROWS_STEPWISE and n_in >= TILED_MIN_ROWS:
        return _tiled(q8, xd, w, layout.qtype)
    return _q4_k(q8, xd, w) if layout.qtype == T.Q4_K else _q6_k(q8, xd, w)


def _int_dots(q8: torch.Tensor, values: torch.Tensor, width: int) -> torch.Tensor:
    """Sums of `width` consecutive products: q8 (n_in, blocks, 256), values (rows, blocks, 256) -> (blocks,
    256 / width, n_in, rows) int64."""
    n_in, n_blocks, n_rows = len(q8), q8.shape[1], len(values)
    groups = n_blocks * 256 // width
    sums = torch.bmm(q8.reshape(n_in, groups, width).transpose(0, 1),
                     values.float().reshape(n_rows, groups, width).permute(1, 2, 0))
    return sums.reshape(n_blocks, 256 // width, n_in, n_rows).long()


def _scaled(w_part: torch.Tensor) -> torch.Tensor:
    """Per-super-block weight values (rows, blocks, k) -> (blocks, k, 1, rows) int64, to multiply _int_dots."""
    return w_part.permute(1, 2, 0)[:, :, None].long()


def _sub_block_sums(q8: torch.Tensor, width: int) -> torch.Tensor:
    """The q8 sums of each `width` values: (blocks, 256 / width, n_in, 1) int64."""
    return q8.reshape(len(q8), q8.shape[1], 256 // width, width).sum(-1).long().permute(1, 2, 0)[..., None]


def _scales(xd: torch.Tensor, w_scale: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """(sign * d_x) * d_w (blocks, n_in, rows), float32 products held in float64 for the fma chains."""
    return ((sign * xd).T[:, :, None] * w_scale.T[:, None, :]).double()


def _q4_k_repacked(q8, xd, w, per_64: bool) -> torch.Tensor:
    """gemv: one fma per super-block for the scales and one for the mins; gemm (per_64): one per 64 values."""
    n_blocks = q8.shape[1]
    isum = (_int_dots(q8, w["values"], 32) * _scaled(w["scales"]))
    imin = _sub_block_sums(q8, 32) * _scaled(w["mins"])
    isum, imin = (v.reshape(n_blocks, 4, 2, *v.shape[2:]).sum(2) for v in (isum, imin))
    d, dmin = _scales(xd, w["d"])[:, None], _scales(xd, w["dmin"])[:, None]
    if per_64:
        flat = [v.flatten(0, 1) for v in (isum, imin, d.expand_as(isum), dmin.expand_as(imin))]
        return fma_chain(flat[0].float(), flat[2]) - fma_chain(flat[1].float(), flat[3])
    return fma_chain(isum.sum(1).float(), d[:, 0]) - fma_chain(imin.sum(1).float(), dmin[:, 0])


def _q4_k(q8, xd, w) -> torch.Tensor:
    """ggml_vec_dot_q4_K_q8_K: 8 lanes of scale * q4 * q8 (lane l: values 4l..4l+3 of every 32), 4 lanes of
    min * sub-block sum (lane k: sub-blocks 2k, 2k + 1); hsum8(acc) + ((m0 + m2) + (m1 + m3))."""
    n_blocks, n_in, n_rows = q8.shape[1], len(q8), len(w["values"])
    dots = _int_dots(q8, w["values"], 4).reshape(n_blocks, 8, 8, n_in, n_rows)     # (blocks, sub-block, lane, ...)
    lanes = (dots * _scaled(w["scales"])[:, :, None]).sum(1)
    mins = _sub_block_sums(q8, 32) * _scaled(w["mins"])
    mins = mins.reshape(n_blocks, 4, 2, n_in, n_rows).sum(2)
    acc = fma_chain(lanes.float(), _scales(xd, w["d"])[:, None])
    acc_m = fma_chain(mins.float(), _scales(xd, w["dmin"], sign=-1.0)[:, None])
    return gm.hsum8(acc.movedim(0, -1)) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))


def _q6_k(q8, xd, w) -> torch.Tensor:
    """ggml_vec_dot_q6_K_q8_K: 8 lanes (lane l: values 4l..4l+3 of every 32, times their 16-value scale, less 32 *
    (bsum_2l * scale_2l + bsum_2l+1 * scale_2l+1)); acc_l = fma(d_x * d_w, lane_l, acc_l); hsum8."""
    n_blocks, n_in, n_rows = q8.shape[1], len(q8), len(w["values"])
    dots = _int_dots(q8, w["values"], 4).reshape(n_blocks, 8, 8, n_in, n_rows)     # (blocks, chunk of 32, lane, ...)
    scales = _scaled(w["scales"])                                                   # (blocks, 16, 1, rows)
    lane_scales = scales.reshape(n_blocks, 8, 2, 1, n_rows).repeat_interleave(4, 2)  # lane l: scale 2k + l // 4
    lanes = (dots * lane_scales).sum(1)
    offset = (_sub_block_sums(q8, 16) * scales).reshape(n_blocks, 8, 2, n_in, n_rows).sum(2)
    acc = fma_chain((lanes - 32 * offset).float(), _scales(xd, w["d"])[:, None])
    return gm.hsum8(acc.movedim(0, -1))


def _tiled(q8, xd, w, qtype) -> torch.Tensor:
    """tiled_run_microtile_avx2: per super-block s1 = sum of scale_s * (values . q8) over sub-blocks s (Q6_K:
    values - 32, 16 wide; Q4_K: 32 wide), res = d_w * s1 (Q4_K: less dmin_w * s2 in one fnmadd, s2 = sum of
    min_s * the sub-block's q8 sum), acc = fma(res, d_x, acc)."""
    width = 16 if qtype == T.Q6_K else 32
    values = w["values"] - 32 if qtype == T.Q6_K else w["values"]
    s1 = (_int_dots(q8, values, width) * _scaled(w["scales"])).sum(1)
    res = (w["d"].T[:, None, :] * s1.float())
    if qtype == T.Q4_K:
        s2 = (_sub_block_sums(q8, 32) * _scaled(w["mins"])).sum(1)
        res = gm.fma(-w["dmin"].T[:, None, :], s2.float(), res)
    return fma_chain(res, xd.T[:, :, None].double())
