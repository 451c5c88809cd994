"""Q4_K and Q6_K dots on integers, summed as llama.cpp's CPU backend sums them (x86-64, AVX2 build), bit for bit.

The input goes through Q8_K (quantize_row_q8_K_ref: per 256 values q = min(127, nearest_int(x * iscale)) with
iscale = -127 / the value of largest magnitude, d = 1 / iscale, and the sums of each 16 q). Every integer sum is
exact (llama.cpp's 16-bit intermediates cannot overflow for these value ranges; simd.q4_k_chunk_lanes_* and
q6_k_lanes_* compute them), so only the float steps, per 256-value super-block, decide the bits. Which kernel llama.cpp
gives an input row (rows_kquant), and its float steps:

- GEMV, GEMM: Q4_K in a matrix llama.cpp repacks (rows a multiple of 8: ggml_gemv / gemm_q4_K_8x8_q8_K, its
  CPU_REPACK buffer). gemv: per weight row, acc = fma(isum, d_w * d_x, acc) and acc_m = fma(imin, dmin_w * d_x,
  acc_m) over the super-blocks, result acc - acc_m (isum = sum of scale_j * (q4 . q8) over the 8 sub-blocks j,
  imin = sum of min_j * the q8 sum of sub-block j). The gemm, which takes a mul_mat's input rows in groups of 4
  when it has more than 3, makes the two fmas per 64 values instead (sub-blocks 2k, 2k + 1); the rest go through
  the gemv, and so does every row of mul_mat_id.
- TILED: other Q4_K and all Q6_K, in a mul_mat of 8 rows or more or for an expert given 8 rows or more
  (ggml-cpu/tiled, tiled_run_microtile_avx2): res = d_w * s1, less dmin_w * s2 in one fnmadd (Q4_K), acc =
  fma(res, d_x, acc) over the super-blocks (s1 = sum of scale_s * ((q - bias) . q8), Q6_K's bias 32; s2 = imin).
- VEC_DOT: the same with fewer rows (ggml_vec_dot_q4_K_q8_K, ggml_vec_dot_q6_K_q8_K): 8 integer lanes, lane l
  holding the products at positions 4l..4l+3 of every 32 times their scale (Q6_K: less 32 * (bsum_2l * scale_2l
  + bsum_2l+1 * scale_2l+1)), acc_l = fma(d_x * d_w, lane_l, acc_l), hsum8; Q4_K adds 4 lanes of min * sub-block
  sum (lane k: sub-blocks 2k, 2k + 1) in a chain with -d_x * dmin_w, ((m0 + m2) + (m1 + m3)).

So rows depend on the batch as llama.cpp's do. Not reproduced: the gemm's rows are rounded through
ggml_quantize_mat_q8_K_4x8, which differs from quantize_row_q8_K only where a block's largest magnitude is held
by both a value and its negation. Q2_K, Q3_K and Q5_K keep matmul.py's float path, within float rounding of
llama.cpp.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit

from ggtools.quants.floatbits import FP16_TO_F32
from ggtools.runtime.kernels.ggmlmath import EXACT, fma
from ggtools.runtime.kernels.simd import (fma_lanes8, q4_k_chunk_lanes_1, q4_k_chunk_lanes_4, q4_k_chunk_lanes_8,
                                          q6_k_lanes_1, q6_k_lanes_4, q6_k_lanes_8, q8_k_block, q8_k_max)

QK_K = 256
Q4_K_BLOCK, Q6_K_BLOCK = 144, 210
F32 = np.float32
U = np.uint64

Q4_K, Q6_K = int(T.Q4_K), int(T.Q6_K)
Q4_K_REPACKED = 1000 + Q4_K   # kernel ids: as matmul.py names the kernels of repacked matrices
TILED_MIN_ROWS = 8            # ggml_tiled_min_batch: a matmul's rows, or the rows routed to one expert
# how llama.cpp meets a call's input rows: each alone (a stepwise batch: one-token graphs), one mul_mat, or the rows
# mul_mat_id routes to one expert
ROWS_STEPWISE, ROWS_MATMUL, ROWS_EXPERT = 0, 1, 2
# the kernel that sums an input row (module docstring)
VEC_DOT, GEMV, GEMM, TILED = range(4)


@njit(**EXACT)
def quantize_q8_k_row(x, q, d, bsums, values):
    """quantize_row_q8_K_ref of one row: q int8 (n), d float32 (n / 256), bsums int32 (n / 16), and values the
    float q * d. But for a block holding a NaN, which ggml's nearest_int makes 0 (so its dots stay finite and a NaN
    passes unseen): its scale is NaN, so are its dots, and the forward's logits check stops the step. Rows of unit
    stride (the vector kernels read them so)."""
    for b in range(x.size // QK_K):
        o = b * QK_K
        has_nan, vmax = q8_k_max(x, o)
        if has_nan or vmax == F32(0.0):
            d[b] = F32(np.nan) if has_nan else F32(0.0)
            q[o:o + QK_K] = 0
            values[o:o + QK_K] = F32(0.0) * d[b]
            bsums[16 * b:16 * b + 16] = 0
            continue
        iscale = F32(-127.0) / vmax
        d[b] = F32(1.0) / iscale
        q8_k_block(x, o, iscale, d[b], q, values, bsums, 16 * b)


@njit(inline="always", **EXACT)
def f16_at(buf, o):
    return FP16_TO_F32[np.int64(buf[o]) | (np.int64(buf[o + U(1)]) << 8)]


@njit(inline="always", **EXACT)
def q4_k_row_scales(buf, so, n_blocks, sc, mn, d, dmin):
    """A Q4_K weight row's per-super-block numbers, decoded once for all the input rows it meets: get_scale_min_k4
    for the 8 sub-blocks of super-block b into sc[8b:8b + 8], mn[8b:8b + 8], and its d and dmin."""
    for b in range(n_blocks):
        bo = so + U(b) * U(Q4_K_BLOCK)
        o, k = bo + U(4), 8 * b
        for j in range(4):
            sc[k + j] = np.int32(buf[o + U(j)]) & 63
            mn[k + j] = np.int32(buf[o + U(j + 4)]) & 63
        for j in range(4, 8):
            sc[k + j] = (np.int32(buf[o + U(j + 4)]) & 15) | ((np.int32(buf[o + U(j - 4)]) >> 6) << 4)
            mn[k + j] = (np.int32(buf[o + U(j + 4)]) >> 4) | ((np.int32(buf[o + U(j)]) >> 6) << 4)
        d[b], dmin[b] = f16_at(buf, bo), f16_at(buf, bo + U(2))


@njit(inline="always", **EXACT)
def hsum8(a, r):
    """hsum_float_8 of a[r, :8]: (a0 + a4) + (a2 + a6) + ((a1 + a5) + (a3 + a7))."""
    return ((a[r, 0] + a[r, 4]) + (a[r, 2] + a[r, 6])) + ((a[r, 1] + a[r, 5]) + (a[r, 3] + a[r, 7]))


@njit(inline="always", **EXACT)
def q4_k_lanes(n, buf, bo, q8, t, xo, sc, mn, so, bsums, go, lanes):
    """simd.q4_k_chunk_lanes_<n> for input rows t..t + n - 1 (n: 1, 4 or 8)."""
    if n == 8:
        q4_k_chunk_lanes_8(buf, bo, q8, t, xo, sc, mn, so, bsums, go, lanes)
    elif n == 4:
        q4_k_chunk_lanes_4(buf, bo, q8, t, xo, sc, mn, so, bsums, go, lanes)
    else:
        q4_k_chunk_lanes_1(buf, bo, q8, t, xo, sc, mn, so, bsums, go, lanes)


@njit(inline="always", **EXACT)
def q6_k_lanes(n, buf, bo, q8, t, xo, bsums, go, lanes):
    """simd.q6_k_lanes_<n> for input rows t..t + n - 1 (n: 1, 4 or 8)."""
    if n == 8:
        q6_k_lanes_8(buf, bo, q8, t, xo, bsums, go, lanes)
    elif n == 4:
        q6_k_lanes_4(buf, bo, q8, t, xo, bsums, go, lanes)
    else:
        q6_k_lanes_1(buf, bo, q8, t, xo, bsums, go, lanes)


@njit(inline="always", **EXACT)
def group_rows(t, end):
    """How many input rows from t on (before end) share each decoded weight chunk: 8, 4 or 1."""
    return 8 if t + 8 <= end else 4 if t + 4 <= end else 1


@njit(**EXACT)
def rows_q4_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, t0, t1, tiled, repacked,
              gemm_end):
    """rows_kquant for Q4_K: each weight row's scales decoded once (q4_k_row_scales), then its dot with input rows
    t..t + n - 1 (group_rows), each as its variant sums it (module docstring). The loops live here, with the scratch
    arrays, so that numba counts no references inside them."""
    sc, mn = np.empty(8 * n_blocks, np.int32), np.empty(8 * n_blocks, np.int32)
    d_ws, dmin_ws = np.empty(n_blocks, np.float32), np.empty(n_blocks, np.float32)
    lanes, acc, acc_m = np.empty((8, 16), np.int32), np.empty((8, 8), np.float32), np.empty((8, 4), np.float32)
    total, total_m = np.empty(8, np.float32), np.empty(8, np.float32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        q4_k_row_scales(buf, so, n_blocks, sc, mn, d_ws, dmin_ws)
        t = t0
        while t < t1:
            n = group_rows(t, t1)
            variant = TILED if tiled else (GEMM if t < gemm_end else GEMV) if repacked else VEC_DOT
            for r in range(n):
                for l in range(8):
                    acc[r, l] = F32(0.0)
                for k in range(4):
                    acc_m[r, k] = F32(0.0)
                total[r] = total_m[r] = F32(0.0)
            for b in range(n_blocks):
                q4_k_lanes(n, buf, so + U(b) * U(Q4_K_BLOCK), q8, t, U(QK_K * b), sc, mn, U(8 * b), bsums, U(16 * b),
                           lanes)
                d_w, dmin_w = d_ws[b], dmin_ws[b]
                for r in range(n):
                    x_d = xd[t + r, b]
                    if variant == VEC_DOT:
                        d, dmin = x_d * d_w, -x_d * dmin_w
                        fma_lanes8(acc, r, d, lanes)
                        for k in range(4):
                            acc_m[r, k] = fma(dmin, F32(lanes[r, 12 + k]), acc_m[r, k])
                        continue
                    isum, imin = np.int32(0), np.int32(0)
                    for c in range(4):
                        isum += lanes[r, 8 + c]
                        imin += lanes[r, 12 + c]
                        if variant == GEMM:
                            total[r] = fma(F32(isum), d_w * x_d, total[r])
                            total_m[r] = fma(F32(imin), dmin_w * x_d, total_m[r])
                            isum, imin = np.int32(0), np.int32(0)
                    if variant == GEMV:
                        total[r] = fma(F32(isum), d_w * x_d, total[r])
                        total_m[r] = fma(F32(imin), dmin_w * x_d, total_m[r])
                    elif variant == TILED:
                        total[r] = fma(fma(-dmin_w, F32(imin), d_w * F32(isum)), x_d, total[r])
            for r in range(n):
                if variant == VEC_DOT:
                    out[t + r, column + i] = hsum8(acc, r) + ((acc_m[r, 0] + acc_m[r, 2]) + (acc_m[r, 1] + acc_m[r, 3]))
                else:
                    out[t + r, column + i] = total[r] - total_m[r]
            t += n


@njit(**EXACT)
def rows_q6_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, t0, t1, tiled):
    """rows_kquant for Q6_K (as rows_q4_k): vec_dot's 8 lanes, or the tiled kernel's chain (module docstring)."""
    lanes, acc, total = np.empty((8, 16), np.int32), np.empty((8, 8), np.float32), np.empty(8, np.float32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        t = t0
        while t < t1:
            n = group_rows(t, t1)
            for r in range(n):
                for l in range(8):
                    acc[r, l] = F32(0.0)
                total[r] = F32(0.0)
            for b in range(n_blocks):
                bo = so + U(b) * U(Q6_K_BLOCK)
                q6_k_lanes(n, buf, bo, q8, t, U(QK_K * b), bsums, U(16 * b), lanes)
                d_w = f16_at(buf, bo + U(208))
                for r in range(n):
                    if tiled:
                        total[r] = fma(d_w * F32(lanes[r, 8]), xd[t + r, b], total[r])
                    else:
                        fma_lanes8(acc, r, xd[t + r, b] * d_w, lanes)
            for r in range(n):
                out[t + r, column + i] = total[r] if tiled else hsum8(acc, r)
            t += n


def rows_mode(stepwise: bool, expert: bool) -> int:
    return ROWS_EXPERT if expert else ROWS_STEPWISE if stepwise else ROWS_MATMUL


@njit(**EXACT)
def rows_kquant(kernel, buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, t0, t1, mode):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, t0 <= t < t1, each input row through the
    kernel llama.cpp gives it in `mode`; input rows go 8, then 4 at a time, then one at a time, sharing each decoded
    weight chunk (the kernel is the same for every row of a group: the gemm's rows are the first multiple of 4)."""
    n_in = t1 - t0
    gemm_end = t0 + n_in // 4 * 4 if kernel == Q4_K_REPACKED and mode == ROWS_MATMUL and n_in > 3 else t0
    tiled = kernel != Q4_K_REPACKED and mode != ROWS_STEPWISE and n_in >= TILED_MIN_ROWS
    if kernel == Q6_K:
        rows_q6_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, t0, t1, tiled)
    else:
        rows_q4_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, t0, t1, tiled,
                  kernel == Q4_K_REPACKED, gemm_end)
