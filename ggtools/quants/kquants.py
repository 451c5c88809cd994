"""K-quants (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

quantize_block_* port ggml's quantize_row_*_ref (quant-recipes.md §5); they need caller-owned
scratch: `L` (int64[256]) and `work` (float32[WORK_ROWS + 3, 32]). decode_block_* port
dequantize_row_* and need none, so a runtime can call them block by block.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit, prange

from .floatbits import JIT, fp16_at, nearest_int, store_fp16
from .scalesearch import (F0, LANES, WORK_ROWS, clamp, make_q3_quants, make_qkx2_quants,
                          make_qx_quants)

QK_K, Q2_K_BYTES = GGML_QUANT_SIZES[T.Q2_K]
Q3_K_BYTES = GGML_QUANT_SIZES[T.Q3_K][1]
Q4_K_BYTES = GGML_QUANT_SIZES[T.Q4_K][1]
Q5_K_BYTES = GGML_QUANT_SIZES[T.Q5_K][1]
Q6_K_BYTES = GGML_QUANT_SIZES[T.Q6_K][1]

GROUP = 16  # blocks per parallel work item (scratch is allocated once per group)
W_WEIGHTS, W_SCALES, W_MINS = WORK_ROWS, WORK_ROWS + 1, WORK_ROWS + 2


@njit(**JIT)
def new_scratch():
    return np.empty(QK_K, np.int64), np.empty((WORK_ROWS + 3, max(LANES, 32)), np.float32)


# ---------------------------------------------------------------- shared packing helpers

@njit(**JIT)
def pack_2bit(L, y, qo):
    """qs[32h + l] = L[128h+l] | L[128h+l+32] << 2 | L[..+64] << 4 | L[..+96] << 6."""
    for h in range(2):
        for l in range(32):
            e = 128 * h + l
            y[qo + 32 * h + l] = L[e] | (L[e + 32] << 2) | (L[e + 64] << 4) | (L[e + 96] << 6)


@njit(**JIT)
def get_scale_min_k4(j, q, so):
    if j < 4:
        return np.int64(q[so + j]) & 63, np.int64(q[so + j + 4]) & 63
    sc = (np.int64(q[so + j + 4]) & 15) | ((np.int64(q[so + j - 4]) >> 6) << 4)
    m = (np.int64(q[so + j + 4]) >> 4) | ((np.int64(q[so + j]) >> 6) << 4)
    return sc, m


@njit(**JIT)
def sub_block_weights(x, xo, w):
    """Q4_K/Q5_K weights of a 32-element sub-block: av_x + |x| with av_x = sqrt(mean(x^2))."""
    sum_x2 = F0
    for l in range(32):
        sum_x2 += x[xo + l] * x[xo + l]
    av_x = np.sqrt(sum_x2 / np.float32(32.0))
    for l in range(32):
        w[l] = av_x + abs(x[xo + l])


@njit(**JIT)
def quantize_k4_scales(nmax, rmin, nstep, x, xo, y, yo, L, work):
    """Steps 1-6 shared by Q4_K and Q5_K: search each sub-block, pack the 6-bit scales/mins and
    d/dmin at y[yo:yo+16], then redo L against the rounded scales."""
    scales, mins, w = work[W_SCALES], work[W_MINS], work[W_WEIGHTS]
    max_scale = F0
    max_min = F0
    for j in range(8):
        sub_block_weights(x, xo + 32 * j, w)
        s, m = make_qkx2_quants(32, nmax, x, xo + 32 * j, w, L, 32 * j, rmin, np.float32(0.1),
                                nstep, False, work)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    inv_scale = np.float32(63.0) / max_scale if max_scale > F0 else F0
    inv_min = np.float32(63.0) / max_min if max_min > F0 else F0
    so = yo + 4
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            y[so + j] = ls
            y[so + j + 4] = lm
        else:
            y[so + j + 4] = (ls & 15) | ((lm & 15) << 4)
            y[so + j - 4] |= (ls >> 4) << 6
            y[so + j] |= (lm >> 4) << 6
    store_fp16(y, yo, max_scale / np.float32(63.0))
    store_fp16(y, yo + 2, max_min / np.float32(63.0))
    d_all = fp16_at(y, yo)
    m_all = fp16_at(y, yo + 2)
    for j in range(8):
        sc, m = get_scale_min_k4(j, y, so)
        d = d_all * np.float32(sc)
        if d == F0:
            continue
        dm = m_all * np.float32(m)
        for i in range(32):
            L[32 * j + i] = clamp(nearest_int((x[xo + 32 * j + i] + dm) / d), 0, nmax)


# ---------------------------------------------------------------- Q2_K

@njit(**JIT)
def quantize_block_q2_k(x, xo, y, yo, L, work):
    scales, mins, w = work[W_SCALES], work[W_MINS], work[W_WEIGHTS]
    max_scale = F0
    max_min = F0
    for j in range(16):
        for l in range(16):
            w[l] = abs(x[xo + 16 * j + l])
        s, m = make_qkx2_quants(16, 3, x, xo + 16 * j, w, L, 16 * j, np.float32(-0.5),
                                np.float32(0.1), 15, True, work)
        scales[j] = s
        mins[j] = m
        if s > max_scale:
            max_scale = s
        if m > max_min:
            max_min = m
    q4scale = np.float32(15.0)
    if max_scale > F0:
        iscale = q4scale / max_scale
        for j in range(16):
            y[yo + j] = nearest_int(iscale * scales[j]) & 0xFF
        store_fp16(y, yo + 80, max_scale / q4scale)
    else:
        for j in range(16):
            y[yo + j] = 0
        store_fp16(y, yo + 80, F0)
    if max_min > F0:
        iscale = q4scale / max_min
        for j in range(16):
            y[yo + j] |= (nearest_int(iscale * mins[j]) << 4) & 0xFF
        store_fp16(y, yo + 82, max_min / q4scale)
    else:
        store_fp16(y, yo + 82, F0)
    d_all = fp16_at(y, yo + 80)
    m_all = fp16_at(y, yo + 82)
    for j in range(16):
        sc = np.int64(y[yo + j])
        d = d_all * np.float32(sc & 15)
        if d == F0:
            continue
        dm = m_all * np.float32(sc >> 4)
        for i in range(16):
            L[16 * j + i] = clamp(nearest_int((x[xo + 16 * j + i] + dm) / d), 0, 3)
    pack_2bit(L, y, yo + 16)


@njit(**JIT)
def decode_block_q2_k(src, so, out, oo):
    d = fp16_at(src, so + 80)
    dmin = fp16_at(src, so + 82)
    for e in range(QK_K):
        sc = np.int64(src[so + e // 16])
        h, r = e // 128, e % 128
        q = (np.int64(src[so + 16 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        dl = d * np.float32(sc & 15)
        ml = dmin * np.float32(sc >> 4)
        out[oo + e] = dl * np.float32(q) - ml


# ---------------------------------------------------------------- Q3_K

@njit(**JIT)
def q3_scale(src, so, j):
    """6-bit scale j of a Q3_K block (still offset by +32)."""
    low = (np.int64(src[so + j]) & 15) if j < 8 else (np.int64(src[so + j - 8]) >> 4)
    high = (np.int64(src[so + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return low | (high << 4)


@njit(**JIT)
def quantize_block_q3_k(x, xo, y, yo, L, work):
    scales = work[W_SCALES]
    max_scale = F0
    amax = F0
    for j in range(16):
        s = make_q3_quants(16, 4, x, xo + 16 * j, L, 16 * j)
        scales[j] = s
        if abs(s) > amax:
            amax = abs(s)
            max_scale = s
    so = yo + 96
    for k in range(12):
        y[so + k] = 0
    if max_scale != F0:
        iscale = np.float32(-32.0) / max_scale
        for j in range(16):
            l = nearest_int(iscale * scales[j]) & 0xFF
            l = l - 256 if l > 127 else l  # int8_t
            l = clamp(l, -32, 31) + 32
            if j < 8:
                y[so + j] = l & 15
            else:
                y[so + j - 8] |= (l & 15) << 4
            y[so + 8 + j % 4] |= (l >> 4) << (2 * (j // 4))
        store_fp16(y, yo + 108, np.float32(1.0) / iscale)
    else:
        store_fp16(y, yo + 108, F0)
    d_all = fp16_at(y, yo + 108)
    for j in range(16):
        d = d_all * np.float32(q3_scale(y, so, j) - 32)
        if d == F0:
            continue
        for i in range(16):
            L[16 * j + i] = clamp(nearest_int(x[xo + 16 * j + i] / d), -4, 3) + 4
    for k in range(32):
        y[yo + k] = 0
    for e in range(QK_K):
        if L[e] > 3:
            y[yo + e % 32] |= 1 << (e // 32)
            L[e] -= 4
    pack_2bit(L, y, yo + 32)


@njit(**JIT)
def decode_block_q3_k(src, so, out, oo):
    d = fp16_at(src, so + 108)
    for e in range(QK_K):
        dl = d * np.float32(q3_scale(src, so + 96, e // 16) - 32)
        h, r = e // 128, e % 128
        q = (np.int64(src[so + 32 + 32 * h + r % 32]) >> (2 * (r // 32))) & 3
        hbit = (np.int64(src[so + e % 32]) >> (e // 32)) & 1
        out[oo + e] = dl * np.float32(q - (0 if hbit else 4))


# ---------------------------------------------------------------- Q4_K

@njit(**JIT)
def quantize_block_q4_k(x, xo, y, yo, L, work):
    quantize_k4_scales(15, np.float32(-1.0), 20, x, xo, y, yo, L, work)
    for c in range(4):
        for l in range(32):
            y[yo + 16 + 32 * c + l] = L[64 * c + l] | (L[64 * c + 32 + l] << 4)


@njit(**JIT)
def decode_block_q4_k(src, so, out, oo):
    d = fp16_at(src, so)
    dmin = fp16_at(src, so + 2)
    for c in range(4):
        sc, m = get_scale_min_k4(2 * c, src, so + 4)
        d1 = d * np.float32(sc)
        m1 = dmin * np.float32(m)
        sc, m = get_scale_min_k4(2 * c + 1, src, so + 4)
        d2 = d * np.float32(sc)
        m2 = dmin * np.float32(m)
        for l in range(32):
            q = np.int64(src[so + 16 + 32 * c + l])
            out[oo + 64 * c + l] = d1 * np.float32(q & 15) - m1
            out[oo + 64 * c + 32 + l] = d2 * np.float32(q >> 4) - m2


# ---------------------------------------------------------------- Q5_K

@njit(**JIT)
def quantize_block_q5_k(x, xo, y, yo, L, work):
    quantize_k4_scales(31, np.float32(-0.5), 15, x, xo, y, yo, L, work)
    qh = yo + 16
    for l in range(32):
        y[qh + l] = 0
    for c in range(4):
        for l in range(32):
            lo = L[64 * c + l]
            hi = L[64 * c + 32 + l]
            if lo > 15:
                lo -= 16
                y[qh + l] |= 1 << (2 * c)
            if hi > 15:
                hi -= 16
                y[qh + l] |= 2 << (2 * c)
            y[yo + 48 + 32 * c + l] = lo | (hi << 4)


@njit(**JIT)
def decode_block_q5_k(src, so, out, oo):
    d = fp16_at(src, so)
    dmin = fp16_at(src, so + 2)
    for c in range(4):
        sc, m = get_scale_min_k4(2 * c, src, so + 4)
        d1 = d * np.float32(sc)
        m1 = dmin * np.float32(m)
        sc, m = get_scale_min_k4(2 * c + 1, src, so + 4)
        d2 = d * np.float32(sc)
        m2 = dmin * np.float32(m)
        for l in range(32):
            q = np.int64(src[so + 48 + 32 * c + l])
            h = np.int64(src[so + 16 + l]) >> (2 * c)
            out[oo + 64 * c + l] = d1 * np.float32((q & 15) + 16 * (h & 1)) - m1
            out[oo + 64 * c + 32 + l] = d2 * np.float32((q >> 4) + 16 * ((h >> 1) & 1)) - m2


# ---------------------------------------------------------------- Q6_K

@njit(**JIT)
def quantize_block_q6_k(x, xo, y, yo, L, work):
    scales = work[W_SCALES]
    max_scale = F0
    max_abs_scale = F0
    for j in range(16):
        s = make_qx_quants(16, 32, x, xo + 16 * j, L, 16 * j, work)
        scales[j] = s
        if abs(s) > max_abs_scale:
            max_abs_scale = abs(s)
            max_scale = s
    if max_abs_scale < np.float32(1e-15):
        for k in range(Q6_K_BYTES):
            y[yo + k] = 0
        return
    iscale = np.float32(-128.0) / max_scale
    store_fp16(y, yo + 208, np.float32(1.0) / iscale)
    for j in range(16):
        y[yo + 192 + j] = min(127, nearest_int(iscale * scales[j])) & 0xFF
    d_all = fp16_at(y, yo + 208)
    for j in range(16):
        sc = np.int64(y[yo + 192 + j])
        d = d_all * np.float32(sc - ((sc & 128) << 1))
        if d == F0:
            continue
        for i in range(16):
            L[16 * j + i] = clamp(nearest_int(x[xo + 16 * j + i] / d), -32, 31) + 32
    for h in range(2):
        ql = yo + 64 * h
        qh = yo + 128 + 32 * h
        e = 128 * h
        for l in range(32):
            y[ql + l] = (L[e + l] & 15) | ((L[e + l + 64] & 15) << 4)
            y[ql + l + 32] = (L[e + l + 32] & 15) | ((L[e + l + 96] & 15) << 4)
            y[qh + l] = ((L[e + l] >> 4) | ((L[e + l + 32] >> 4) << 2)
                         | ((L[e + l + 64] >> 4) << 4) | ((L[e + l + 96] >> 4) << 6))


@njit(**JIT)
def decode_block_q6_k(src, so, out, oo):
    d = fp16_at(src, so + 208)
    for h in range(2):
        ql = so + 64 * h
        qh = so + 128 + 32 * h
        for l in range(32):
            hb = np.int64(src[qh + l])
            lo = np.int64(src[ql + l])
            hi = np.int64(src[ql + l + 32])
            qs = ((lo & 15) | ((hb & 3) << 4), (hi & 15) | (((hb >> 2) & 3) << 4),
                  (lo >> 4) | (((hb >> 4) & 3) << 4), (hi >> 4) | (((hb >> 6) & 3) << 4))
            for k in range(4):
                e = 128 * h + l + 32 * k
                sc = np.int64(src[so + 192 + e // 16])
                dl = d * np.float32(sc - ((sc & 128) << 1))
                out[oo + e] = dl * np.float32(qs[k] - 32)


# ---------------------------------------------------------------- parallel row kernels
# Rows are contiguous, so block b of a chunk reads x[b*QK_K:] and writes y[b*bytes:].

@njit(parallel=True, **JIT)
def quantize_q2_k(x, y):
    nb = x.size // QK_K
    for g in prange((nb + GROUP - 1) // GROUP):
        L, work = new_scratch()
        for b in range(g * GROUP, min(nb, (g + 1) * GROUP)):
            quantize_block_q2_k(x, b * QK_K, y, b * Q2_K_BYTES, L, work)


@njit(parallel=True, **JIT)
def quantize_q3_k(x, y):
    nb = x.size // QK_K
    for g in prange((nb + GROUP - 1) // GROUP):
        L, work = new_scratch()
        for b in range(g * GROUP, min(nb, (g + 1) * GROUP)):
            quantize_block_q3_k(x, b * QK_K, y, b * Q3_K_BYTES, L, work)


@njit(parallel=True, **JIT)
def quantize_q4_k(x, y):
    nb = x.size // QK_K
    for g in prange((nb + GROUP - 1) // GROUP):
        L, work = new_scratch()
        for b in range(g * GROUP, min(nb, (g + 1) * GROUP)):
            quantize_block_q4_k(x, b * QK_K, y, b * Q4_K_BYTES, L, work)


@njit(parallel=True, **JIT)
def quantize_q5_k(x, y):
    nb = x.size // QK_K
    for g in prange((nb + GROUP - 1) // GROUP):
        L, work = new_scratch()
        for b in range(g * GROUP, min(nb, (g + 1) * GROUP)):
            quantize_block_q5_k(x, b * QK_K, y, b * Q5_K_BYTES, L, work)


@njit(parallel=True, **JIT)
def quantize_q6_k(x, y):
    nb = x.size // QK_K
    for g in prange((nb + GROUP - 1) // GROUP):
        L, work = new_scratch()
        for b in range(g * GROUP, min(nb, (g + 1) * GROUP)):
            quantize_block_q6_k(x, b * QK_K, y, b * Q6_K_BYTES, L, work)


@njit(parallel=True, **JIT)
def dequantize_q2_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q2_k(src, b * Q2_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q3_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q3_k(src, b * Q3_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q4_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q4_k(src, b * Q4_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q5_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q5_k(src, b * Q5_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q6_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q6_k(src, b * Q6_K_BYTES, out, b * QK_K)
