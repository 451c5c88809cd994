"""Q4_K and Q6_K dots on integers, summed as llama.cpp's CPU backend sums them (x86-64, AVX2 build), bit for bit.

The input goes through Q8_K (quantize_row_q8_K_ref: per 256 values q = min(127, nearest_int(x * iscale)) with
iscale = -127 / the value of largest magnitude, d = 1 / iscale, and the sums of each 16 q). Every integer sum below
is exact (llama.cpp's 16-bit intermediates cannot overflow for these value ranges), so only the float steps, per
256-value super-block, decide the bits:

- Q4_K in a matrix llama.cpp repacks (rows a multiple of 8: ggml_gemv / gemm_q4_K_8x8_q8_K, its CPU_REPACK
  buffer on AVX2): per weight row, acc = fma(isum, d_w * d_x, acc) and acc_m = fma(imin, dmin_w * d_x, acc_m)
  over the super-blocks, result acc - acc_m; isum = sum of scale_j * (q4 . q8) over the 8 sub-blocks j,
  imin = sum of min_j * (the q8 sum of sub-block j). Its gemm (a batch's input rows in groups of 4) makes the
  two fmas per 64 values instead, over sub-blocks 2k and 2k + 1.
- Q6_K (ggml_vec_dot_q6_K_q8_K; x86 never repacks it): 8 integer lanes, lane l holding, per super-block, the
  products of the values at positions 4l..4l+3 of every 32 (times their 16-value scale), less 32 * (bsum_2l *
  scale_2l + bsum_2l+1 * scale_2l+1); acc_l = fma(d_x * d_w, lane_l, acc_l); hsum8.

Other K-quants (and Q4_K matrices llama.cpp does not repack) keep matmul.py's float path, within float rounding
of llama.cpp. Q6_K rows do not depend on the batch (vec_dot row by row); repacked Q4_K rows do, as llama.cpp's
(gemm or gemv by position; the gemm's rows are rounded through ggml_quantize_mat_q8_K_4x8, which differs from
quantize_row_q8_K only where a block's largest magnitude is held by both a value and its negation: not reproduced).
"""

import numpy as np
from numba import njit

from ggtools.quants.floatbits import FP16_TO_F32, nearest_int
from ggtools.runtime.kernels.ggmlmath import EXACT, fma
from ggtools.runtime.kernels.workers import claim, enter, leave

QK_K = 256
Q4_K_BLOCK, Q6_K_BLOCK = 144, 210
F32 = np.float32
U = np.uint64


@njit(**EXACT)
def quantize_q8_k_row(x, q, d, bsums):
    """quantize_row_q8_K_ref of one row: q int8 (n), d float32 (n / 256), bsums int32 (n / 16)."""
    for b in range(x.size // QK_K):
        o = b * QK_K
        amax, vmax = F32(0.0), F32(0.0)
        for j in range(QK_K):
            if abs(x[o + j]) > amax:
                amax, vmax = abs(x[o + j]), x[o + j]
        if amax == F32(0.0):
            d[b] = F32(0.0)
            q[o:o + QK_K] = 0
            bsums[16 * b:16 * b + 16] = 0
            continue
        iscale = F32(-127.0) / vmax
        for j in range(QK_K):
            q[o + j] = min(127, nearest_int(iscale * x[o + j]))
        for g in range(16):
            s = 0
            for j in range(16):
                s += np.int32(q[o + 16 * g + j])
            bsums[16 * b + g] = s
        d[b] = F32(1.0) / iscale


@njit(inline="always", **EXACT)
def f16_at(buf, o):
    return FP16_TO_F32[np.int64(buf[o]) | (np.int64(buf[o + U(1)]) << 8)]


@njit(inline="always", **EXACT)
def q4_k_scales(buf, so, sc, mn):
    """get_scale_min_k4 for the 8 sub-blocks: sc[j], mn[j] from the 12 packed bytes at so."""
    for j in range(4):
        sc[j] = np.int32(buf[so + U(j)]) & 63
        mn[j] = np.int32(buf[so + U(j + 4)]) & 63
    for j in range(4, 8):
        sc[j] = (np.int32(buf[so + U(j + 4)]) & 15) | ((np.int32(buf[so + U(j - 4)]) >> 6) << 4)
        mn[j] = (np.int32(buf[so + U(j + 4)]) >> 4) | ((np.int32(buf[so + U(j)]) >> 6) << 4)


@njit(inline="always", **EXACT)
def dot_q4_k_repacked(buf, so, n_blocks, q8, xd, bsums, sc, mn, n16, gemm):
    """gemv: one fma per super-block for the scales and one for the mins; gemm (a group of 4 input rows): one of
    each per 64 values (two sub-blocks)."""
    acc, acc_m = F32(0.0), F32(0.0)
    n32 = n16 + n16
    for b in range(n_blocks):
        bo = so + U(b) * U(Q4_K_BLOCK)
        q4_k_scales(buf, bo + U(4), sc, mn)
        d, dmin = f16_at(buf, bo) * xd[b], f16_at(buf, bo + U(2)) * xd[b]
        isum, imin = np.int32(0), np.int32(0)
        for c in range(4):
            qo, xo = bo + U(16 + 32 * c), U(QK_K * b + 64 * c)
            lo, hi = np.int32(0), np.int32(0)
            for i in range(n32):
                v = np.int32(buf[qo + i])
                lo += (v & 15) * np.int32(q8[xo + i])
                hi += (v >> 4) * np.int32(q8[xo + n32 + i])
            g = 16 * b + 4 * c
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi
            imin += mn[2 * c] * (bsums[g] + bsums[g + 1]) + mn[2 * c + 1] * (bsums[g + 2] + bsums[g + 3])
            if gemm:
                acc, acc_m = fma(F32(isum), d, acc), fma(F32(imin), dmin, acc_m)
                isum, imin = np.int32(0), np.int32(0)
        if not gemm:
            acc, acc_m = fma(F32(isum), d, acc), fma(F32(imin), dmin, acc_m)
    return acc - acc_m


@njit(inline="always", **EXACT)
def dot_q4_k(buf, so, n_blocks, q8, xd, bsums, sc, mn, products, acc, acc_m, n16):
    """ggml_vec_dot_q4_K_q8_K (AVX2): 8 lanes of scale * q4 * q8 (lane l: positions 4l..4l+3 of every 32), 4 lanes
    of min * sub-block sum (lane k: sub-blocks 2k, 2k + 1), each an fma chain over the super-blocks;
    hsum8(acc) + ((m0 + m2) + (m1 + m3))."""
    acc[:] = F32(0.0)
    acc_m[:] = F32(0.0)
    n32 = n16 + n16
    for b in range(n_blocks):
        bo = so + U(b) * U(Q4_K_BLOCK)
        q4_k_scales(buf, bo + U(4), sc, mn)
        products[:] = 0
        for c in range(4):
            qo, xo = bo + U(16 + 32 * c), U(QK_K * b + 64 * c)
            lo_scale, hi_scale = sc[2 * c], sc[2 * c + 1]
            for i in range(n32):
                v = np.int32(buf[qo + i])
                products[i] += lo_scale * (v & 15) * np.int32(q8[xo + i]) + hi_scale * (v >> 4) * np.int32(q8[xo + n32 + i])
        d, dmin = xd[b] * f16_at(buf, bo), -xd[b] * f16_at(buf, bo + U(2))
        for l in range(8):
            lane = products[4 * l] + products[4 * l + 1] + products[4 * l + 2] + products[4 * l + 3]
            acc[l] = fma(d, F32(lane), acc[l])
        for k in range(4):
            g = 16 * b + 4 * k
            prod = mn[2 * k] * (bsums[g] + bsums[g + 1]) + mn[2 * k + 1] * (bsums[g + 2] + bsums[g + 3])
            acc_m[k] = fma(dmin, F32(prod), acc_m[k])
    return hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))


@njit(inline="always", **EXACT)
def hsum8(a):
    """hsum_float_8: (a0 + a4) + (a2 + a6) + ((a1 + a5) + (a3 + a7))."""
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))


@njit(inline="always", **EXACT)
def dot_q6_k(buf, so, n_blocks, q8, xd, bsums, lanes, products, acc, n16):
    acc[:] = F32(0.0)
    for b in range(n_blocks):
        bo = so + U(b) * U(Q6_K_BLOCK)
        scales = bo + U(192)
        products[:] = 0
        for j in range(2):
            qh = bo + U(128 + 32 * j)
            for c in range(4):
                xo = U(QK_K * b + 128 * j + 32 * c)
                low, shift, high_shift = bo + U(64 * j + 32 * (c & 1)), np.int32(4 * (c >> 1)), np.int32(2 * c)
                for half in range(2):
                    s = np.int32(np.int8(buf[scales + U(8 * j + 2 * c + half)]))
                    h0 = U(half) * n16
                    for i in range(n16):
                        k = h0 + i
                        v = ((np.int32(buf[low + k]) >> shift) & 15) | (((np.int32(buf[qh + k]) >> high_shift) & 3) << 4)
                        products[k] += s * v * np.int32(q8[xo + k])
        for l in range(8):
            lane = products[4 * l] + products[4 * l + 1] + products[4 * l + 2] + products[4 * l + 3]
            g = 16 * b + 2 * l
            lane -= 32 * (bsums[g] * np.int32(np.int8(buf[scales + U(2 * l)]))
                          + bsums[g + 1] * np.int32(np.int8(buf[scales + U(2 * l + 1)])))
            lanes[l] = lane
        d = xd[b] * f16_at(buf, bo + U(208))
        for l in range(8):
            acc[l] = fma(d, F32(lanes[l]), acc[l])
    return hsum8(acc)

# ---- llama.cpp's tiled K-quant matmul (ggml-cpu/tiled): batches of 8 or more rows of matrices it does not repack

@njit(inline="always", **EXACT)
def decode_q6_k_block(buf, bo, values, scales, mins):
    """A Q6_K super-block as the tiled kernel reads it: values q - 32 in element order, 16 int8 scales; (d, dmin)."""
    for half in range(2):
        for c in range(4):
            low, shift = bo + U(64 * half + 32 * (c & 1)), np.int32(4 * (c >> 1))
            for i in range(32):
                v = (np.int32(buf[low + U(i)]) >> shift) & 15
                v |= ((np.int32(buf[bo + U(128 + 32 * half + i)]) >> np.int32(2 * c)) & 3) << 4
                values[128 * half + 32 * c + i] = v - 32
    for j in range(16):
        scales[j] = np.int32(np.int8(buf[bo + U(192 + j)]))
    return f16_at(buf, bo + U(208)), F32(0.0)


@njit(inline="always", **EXACT)
def decode_q4_k_block(buf, bo, values, scales, mins):
    """A Q4_K super-block: values in element order, the 8 sub-blocks' 6-bit scales and mins; (d, dmin)."""
    q4_k_scales(buf, bo + U(4), scales, mins)
    for c in range(4):
        for i in range(32):
            v = np.int32(buf[bo + U(16 + 32 * c + i)])
            values[64 * c + i] = v & 15
            values[64 * c + 32 + i] = v >> 4
    return f16_at(buf, bo), f16_at(buf, bo + U(2))


@njit(inline="always", **EXACT)
def tiled_step(values, scales, mins, sub, has_min, d, dmin, q8, xo, bsums, go, dx, acc):
    """One super-block of tiled_run_microtile_avx2 for one output: s1 = sum of scale_s * (values . q8) over the
    sub-blocks s, res = d * s1, less dmin * s2 in one fnmadd (s2 = sum of min_s * the q8 sum of sub-block s),
    acc = fma(res, d_x, acc)."""
    s1 = np.int32(0)
    for s in range(QK_K // sub):
        raw = np.int32(0)
        for e in range(sub):
            raw += values[s * sub + e] * np.int32(q8[xo + U(s * sub + e)])
        s1 += scales[s] * raw
    res = d * F32(s1)
    if has_min:
        s2 = np.int32(0)
        per = sub // 16
        for s in range(QK_K // sub):
            bsum = np.int32(0)
            for u in range(per):
                bsum += bsums[go + s * per + u]
            s2 += mins[s] * bsum
        res = fma(-dmin, F32(s2), res)
    return fma(res, dx, acc)


Q4_K_REPACKED = 1000 + 12     # kernel ids: 1000 + GGML_TYPE_Q4_K, as matmul.py names repacked kernels
Q4_K, Q6_K = 12, 14
TILED_MIN_ROWS = 8            # ggml_tiled_min_batch: a matmul's rows, or the rows routed to one expert
# how llama.cpp meets a call's input rows: each alone (a stepwise batch: one-token graphs), one mul_mat, or the rows
# mul_mat_id routes to one expert
ROWS_STEPWISE, ROWS_MATMUL, ROWS_EXPERT = 0, 1, 2


def rows_mode(stepwise: bool, expert: bool) -> int:
    return ROWS_EXPERT if expert else ROWS_STEPWISE if stepwise else ROWS_MATMUL


@njit(**EXACT)
def rows_q4_k_repacked(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, n16, gemm_rows):
    sc, mn = np.empty(8, np.int32), np.empty(8, np.int32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        for t in range(q8.shape[0]):
            out[t, column + i] = dot_q4_k_repacked(buf, so, n_blocks, q8[t], xd[t], bsums[t], sc, mn, n16,
                                                   t < gemm_rows)


@njit(**EXACT)
def rows_q4_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, n16):
    sc, mn, products = np.empty(8, np.int32), np.empty(8, np.int32), np.empty(32, np.int32)
    acc, acc_m = np.empty(8, np.float32), np.empty(4, np.float32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        for t in range(q8.shape[0]):
            out[t, column + i] = dot_q4_k(buf, so, n_blocks, q8[t], xd[t], bsums[t], sc, mn, products, acc, acc_m, n16)


@njit(**EXACT)
def rows_q6_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, n16):
    lanes, products, acc = np.empty(8, np.int32), np.empty(32, np.int32), np.empty(8, np.float32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        for t in range(q8.shape[0]):
            out[t, column + i] = dot_q6_k(buf, so, n_blocks, q8[t], xd[t], bsums[t], lanes, products, acc, n16)


@njit(**EXACT)
def rows_tiled(kernel, buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column):
    """llama.cpp's tiled matmul (ggml-cpu/tiled) of Q4_K or Q6_K weight rows: each super-block decoded once per weight
    row, then one tiled_step per input row."""
    values, scales, mins = np.empty(QK_K, np.int32), np.empty(16, np.int32), np.empty(16, np.int32)
    acc = np.empty(q8.shape[0], np.float32)
    q6 = kernel == Q6_K
    block_bytes, sub = (Q6_K_BLOCK, 16) if q6 else (Q4_K_BLOCK, 32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        acc[:] = F32(0.0)
        for b in range(n_blocks):
            bo = so + U(b) * U(block_bytes)
            if q6:
                d, dmin = decode_q6_k_block(buf, bo, values, scales, mins)
            else:
                d, dmin = decode_q4_k_block(buf, bo, values, scales, mins)
            for t in range(q8.shape[0]):
                acc[t] = tiled_step(values, scales, mins, sub, not q6, d, dmin, q8[t], U(QK_K * b), bsums[t], 16 * b,
                                    xd[t, b], acc[t])
        for t in range(q8.shape[0]):
            out[t, column + i] = acc[t]


@njit(**EXACT)
def matmul_kquant(kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, mode, counter):
    """matmul_block32's task loop (matmul.py) for the integer K-quant kernels, each group of input rows as llama.cpp
    runs it (mode: ROWS_*): repacked Q4_K through the gemm in groups of 4 when one mul_mat has more than 3 rows,
    the rest through gemv; other Q4_K and Q6_K through the tiled kernel for 8 rows or more (a mul_mat's, or
    one expert's), else vec_dot. The 16 of the inner loops comes as a runtime value (q8's row length over its
    16-value sums): with constant trip counts LLVM unrolls them and does not vectorize (matmul.py's docstring)."""
    n_blocks = q8.shape[1] // QK_K
    n16 = U(q8.shape[1] // bsums.shape[1])
    n_template = tasks.shape[0]
    enter(counter)
    while True:
        k = claim(counter)
        if k >= n_template * experts.size:
            break
        g, j = k // n_template, k % n_template
        offset, column, n_rows = tasks[j, 0] + experts[g] * tasks[j, 3], tasks[j, 2], tasks[j, 1]
        t0, t1 = groups[g], groups[g + 1]
        if kernel == Q4_K_REPACKED:
            gemm_rows = (t1 - t0) // 4 * 4 if mode == ROWS_MATMUL and t1 - t0 > 3 else 0
            rows_q4_k_repacked(buf, offset, row_bytes, n_rows, n_blocks, q8[t0:t1], xd[t0:t1], bsums[t0:t1],
                               out[t0:t1], column, n16, gemm_rows)
        elif mode != ROWS_STEPWISE and t1 - t0 >= TILED_MIN_ROWS:
            rows_tiled(kernel, buf, offset, row_bytes, n_rows, n_blocks, q8[t0:t1], xd[t0:t1], bsums[t0:t1],
                       out[t0:t1], column)
        elif kernel == Q4_K:
            rows_q4_k(buf, offset, row_bytes, n_rows, n_blocks, q8[t0:t1], xd[t0:t1], bsums[t0:t1], out[t0:t1],
                      column, n16)
        else:
            rows_q6_k(buf, offset, row_bytes, n_rows, n_blocks, q8[t0:t1], xd[t0:t1], bsums[t0:t1], out[t0:t1],
                      column, n16)
    leave(counter)
