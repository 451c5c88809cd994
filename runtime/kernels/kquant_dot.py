"""Q4_K and Q6_K dots on integers, summed as llama.cpp's CPU backend sums them (x86-64, AVX2 build), bit for bit.

The input goes through Q8_K (quantize_row_q8_K_ref: per 256 values q = min(127, nearest_int(x * iscale)) with
iscale = -127 / the value of largest magnitude, d = 1 / iscale, and the sums of each 16 q). Every integer sum below
is exact (llama.cpp's 16-bit intermediates cannot overflow for these value ranges), so only the float steps, per
256-value super-block, decide the bits:

- Q4_K in a matrix llama.cpp repacks (rows a multiple of 8: ggml_gemv / gemm_q4_K_8x8_q8_K, its CPU_REPACK
  buffer on AVX2): per weight row, acc = fma(isum, d_w * d_x, acc) and acc_m = fma(imin, dmin_w * d_x, acc_m)
  over the super-blocks, result acc - acc_m; isum = sum of scale_j * (q4 . q8) over the 8 sub-blocks j,
  imin = sum of min_j * (the q8 sum of sub-block j).
- Q6_K (ggml_vec_dot_q6_K_q8_K; x86 never repacks it): 8 integer lanes, lane l holding, per super-block, the
  products of the values at positions 4l..4l+3 of every 32 (times their 16-value scale), less 32 * (bsum_2l *
  scale_2l + bsum_2l+1 * scale_2l+1); acc_l = fma(d_x * d_w, lane_l, acc_l); hsum8.

Other K-quants (and Q4_K matrices llama.cpp does not repack) keep matmul.py's float path, within float rounding
of llama.cpp. Both kernels take any number of input rows: llama.cpp's gemm and vec_dot give each output the same
float steps as its one-row kernel, so these do not depend on the batch.
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
def dot_q4_k_repacked(buf, so, n_blocks, q8, xd, bsums, sc, mn, n16):
    acc, acc_m = F32(0.0), F32(0.0)
    n32 = n16 + n16
    for b in range(n_blocks):
        bo = so + U(b) * U(Q4_K_BLOCK)
        q4_k_scales(buf, bo + U(4), sc, mn)
        isum = np.int32(0)
        for c in range(4):
            qo, xo = bo + U(16 + 32 * c), U(QK_K * b + 64 * c)
            lo, hi = np.int32(0), np.int32(0)
            for i in range(n32):
                v = np.int32(buf[qo + i])
                lo += (v & 15) * np.int32(q8[xo + i])
                hi += (v >> 4) * np.int32(q8[xo + n32 + i])
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi
        imin = np.int32(0)
        for j in range(8):
            imin += mn[j] * (bsums[16 * b + 2 * j] + bsums[16 * b + 2 * j + 1])
        dx = xd[b]
        acc = fma(F32(isum), f16_at(buf, bo) * dx, acc)
        acc_m = fma(F32(imin), f16_at(buf, bo + U(2)) * dx, acc_m)
    return acc - acc_m


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

Q4_K_REPACKED = 1000 + 12     # kernel ids: 1000 + GGML_TYPE_Q4_K, as matmul.py names repacked kernels
Q6_K = 14


@njit(**EXACT)
def rows_q4_k_repacked(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, n16):
    sc, mn = np.empty(8, np.int32), np.empty(8, np.int32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        for t in range(q8.shape[0]):
            out[t, column + i] = dot_q4_k_repacked(buf, so, n_blocks, q8[t], xd[t], bsums[t], sc, mn, n16)


@njit(**EXACT)
def rows_q6_k(buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, n16):
    lanes, products, acc = np.empty(8, np.int32), np.empty(32, np.int32), np.empty(8, np.float32)
    for i in range(n_rows):
        so = U(offset) + U(i) * U(row_bytes)
        for t in range(q8.shape[0]):
            out[t, column + i] = dot_q6_k(buf, so, n_blocks, q8[t], xd[t], bsums[t], lanes, products, acc, n16)


@njit(**EXACT)
def matmul_kquant(kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, counter):
    """matmul_block32's task loop (matmul.py) for the integer K-quant kernels. The 16 of the inner loops comes
    as a runtime value (q8's row length over its 16-value sums): with constant trip counts LLVM unrolls them and
    does not vectorize (matmul.py's docstring)."""
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
            rows_q4_k_repacked(buf, offset, row_bytes, n_rows, n_blocks, q8[t0:t1], xd[t0:t1], bsums[t0:t1],
                               out[t0:t1], column, n16)
        else:
            rows_q6_k(buf, offset, row_bytes, n_rows, n_blocks, q8[t0:t1], xd[t0:t1], bsums[t0:t1], out[t0:t1],
                      column, n16)
    leave(counter)
