"""K-quant encoders (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Ports of ggml's quantize_row_*_ref (quant-recipes.md §5), with caller-owned scratch so the
parallel kernels allocate once per group of blocks.

Q2_K, Q3_K, Q4_K and Q5_K run a batch of blocks at once, transposed: element i of sub-block c
of the batch at xt[i, c], so every sub-block is a SIMD lane of the scale search (see
scalesearch). Q6_K goes block by block (its search is vectorized over candidate scales and the
block's sub-blocks).
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit, prange

from .floatbits import JIT, fp16_at, nearest_float, nearest_int, store_fp16
from .kdecode import get_scale_min_k4, q3_scale
from .scalesearch import (F0, LANES, QKX2_ROWS, QX_ROWS, QX_SMALL_ROWS, QX_SUBS, clamp, clamp_float, level,
                          make_q3_quants, make_qkx2_quants, make_qx_quants)

QK_K, Q2_K_BYTES = GGML_QUANT_SIZES[T.Q2_K]
Q3_K_BYTES = GGML_QUANT_SIZES[T.Q3_K][1]
Q4_K_BYTES = GGML_QUANT_SIZES[T.Q4_K][1]
Q5_K_BYTES = GGML_QUANT_SIZES[T.Q5_K][1]
Q6_K_BYTES = GGML_QUANT_SIZES[T.Q6_K][1]

BATCH_LANES = 128  # sub-blocks per batch: 16 Q4_K/Q5_K blocks, 8 Q2_K/Q3_K blocks
GROUP = 16  # Q6_K blocks per parallel work item
ROW_D, ROW_DM, ROW_SCALES, ROW_MINS = 0, 1, QKX2_ROWS, QKX2_ROWS + 1


# ---------------------------------------------------------------- batched Q2_K / Q3_K / Q4_K / Q5_K

@njit(**JIT)
def new_batch_scratch():
    size = BATCH_LANES * 32
    return (np.empty(size, np.float32), np.empty(size, np.float32), np.empty(size, np.int32),
            np.empty(size, np.float32), np.empty((QKX2_ROWS + 2, BATCH_LANES), np.float32))


@njit(**JIT)
def load_batch(x, xo, nblocks, n, scratch):
    """Transposed views for nblocks blocks with sub-blocks of n: xt[i, c] = x[xo + n*c + i]
    (sub-block c's values are contiguous in x). Returns xt, wt, Lt, laux, st."""
    xb, wb, lb, ab, st = scratch
    lanes = nblocks * (QK_K // n)
    k = n * lanes
    xt = xb[:k].reshape((n, lanes))
    for c in range(lanes):
        for i in range(n):
            xt[i, c] = x[xo + n * c + i]
    return xt, wb[:k].reshape((n, lanes)), lb[:k].reshape((n, lanes)), ab[:k].reshape((n, lanes)), st


@njit(**JIT)
def requantize_levels(xt, Lt, d, dm, nmax):
    """Second pass against the rounded scales: L = clamp(nearest_int((x + dm) / d), 0, nmax);
    sub-blocks with d == 0 keep the levels of the search."""
    n, lanes = xt.shape
    fnmax = np.float32(nmax)
    for i in range(n):
        for c in range(lanes):
            fl = level((xt[i, c] + dm[c]) / d[c], fnmax)
            Lt[i, c] = np.int32(fl) if d[c] != F0 else Lt[i, c]


@njit(**JIT)
def k4_weights(xt, wt, av_x):
    """Q4_K/Q5_K weights: av_x + |x| with av_x = sqrt(sum(x^2) / 32) per sub-block."""
    n, lanes = xt.shape
    for c in range(lanes):
        av_x[c] = F0
    for i in range(n):
        for c in range(lanes):
            av_x[c] += xt[i, c] * xt[i, c]
    for c in range(lanes):
        av_x[c] = np.sqrt(av_x[c] / np.float32(32.0))
    for i in range(n):
        for c in range(lanes):
            wt[i, c] = av_x[c] + abs(xt[i, c])


@njit(**JIT)
def pack_k4_scales(scales, mins, c0, y, yo, d, dm):
    """Q4_K/Q5_K header of one block (sub-blocks c0..c0+7): 6-bit scales and mins, d, dmin at
    y[yo:yo+16]; then d[c], dm[c] = the rounded per-sub-block scale and min."""
    max_scale = F0
    max_min = F0
    for j in range(8):
        if scales[c0 + j] > max_scale:
            max_scale = scales[c0 + j]
        if mins[c0 + j] > max_min:
            max_min = mins[c0 + j]
    inv_scale = np.float32(63.0) / max_scale if max_scale > F0 else F0
    inv_min = np.float32(63.0) / max_min if max_min > F0 else F0
    so = yo + 4
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[c0 + j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[c0 + j]) & 0xFF)
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
        d[c0 + j] = d_all * np.float32(sc)
        dm[c0 + j] = m_all * np.float32(m)


@njit(**JIT)
def quantize_k4_batch(nmax, rmin, nstep, block_bytes, x, xo, y, yo, nblocks, scratch):
    """Everything Q4_K and Q5_K share; returns Lt, the final levels, for the caller to pack."""
    xt, wt, Lt, laux, st = load_batch(x, xo, nblocks, 32, scratch)
    k4_weights(xt, wt, st[0])
    make_qkx2_quants(nmax, xt, wt, Lt, laux, rmin, np.float32(0.1), nstep, False, st,
                     st[ROW_SCALES], st[ROW_MINS])
    for b in range(nblocks):
        pack_k4_scales(st[ROW_SCALES], st[ROW_MINS], 8 * b, y, yo + block_bytes * b,
                       st[ROW_D], st[ROW_DM])
    requantize_levels(xt, Lt, st[ROW_D], st[ROW_DM], nmax)
    return Lt


@njit(**JIT)
def quantize_blocks_q4_k(x, xo, y, yo, nblocks, scratch):
    """nblocks (<= BATCH_LANES // 8) Q4_K blocks from x[xo:] to y[yo:]."""
    Lt = quantize_k4_batch(15, np.float32(-1.0), 20, Q4_K_BYTES, x, xo, y, yo, nblocks, scratch)
    for b in range(nblocks):
        qs = yo + Q4_K_BYTES * b + 16
        for c in range(4):  # qs[32c + l]: element l of sub-blocks 2c (low) and 2c+1 (high)
            for l in range(32):
                y[qs + 32 * c + l] = Lt[l, 8 * b + 2 * c] | (Lt[l, 8 * b + 2 * c + 1] << 4)


@njit(**JIT)
def quantize_blocks_q5_k(x, xo, y, yo, nblocks, scratch):
    """nblocks (<= BATCH_LANES // 8) Q5_K blocks from x[xo:] to y[yo:]."""
    Lt = quantize_k4_batch(31, np.float32(-0.5), 15, Q5_K_BYTES, x, xo, y, yo, nblocks, scratch)
    for b in range(nblocks):
        qh = yo + Q5_K_BYTES * b + 16
        qs = qh + 32
        for l in range(32):
            y[qh + l] = 0
        for c in range(4):
            for l in range(32):
                lo = Lt[l, 8 * b + 2 * c]
                hi = Lt[l, 8 * b + 2 * c + 1]
                if lo > 15:
                    lo -= 16
                    y[qh + l] |= 1 << (2 * c)
                if hi > 15:
                    hi -= 16
                    y[qh + l] |= 2 << (2 * c)
                y[qs + 32 * c + l] = lo | (hi << 4)


@njit(**JIT)
def pack_q2_k_scales(scales, mins, c0, y, yo, d, dm):
    """Q2_K scale bytes and d/dmin of one block (sub-blocks c0..c0+15); then d[c], dm[c]."""
    max_scale = F0
    max_min = F0
    for j in range(16):
        if scales[c0 + j] > max_scale:
            max_scale = scales[c0 + j]
        if mins[c0 + j] > max_min:
            max_min = mins[c0 + j]
    q4scale = np.float32(15.0)
    if max_scale > F0:
        iscale = q4scale / max_scale
        for j in range(16):
            y[yo + j] = nearest_int(iscale * scales[c0 + j]) & 0xFF
        store_fp16(y, yo + 80, max_scale / q4scale)
    else:
        for j in range(16):
            y[yo + j] = 0
        store_fp16(y, yo + 80, F0)
    if max_min > F0:
        iscale = q4scale / max_min
        for j in range(16):
            y[yo + j] |= (nearest_int(iscale * mins[c0 + j]) << 4) & 0xFF
        store_fp16(y, yo + 82, max_min / q4scale)
    else:
        store_fp16(y, yo + 82, F0)
    d_all = fp16_at(y, yo + 80)
    m_all = fp16_at(y, yo + 82)
    for j in range(16):
        sc = np.int64(y[yo + j])
        d[c0 + j] = d_all * np.float32(sc & 15)
        dm[c0 + j] = m_all * np.float32(sc >> 4)


@njit(**JIT)
def quantize_blocks_q2_k(x, xo, y, yo, nblocks, scratch):
    """nblocks (<= BATCH_LANES // 16) Q2_K blocks from x[xo:] to y[yo:]."""
    xt, wt, Lt, laux, st = load_batch(x, xo, nblocks, 16, scratch)
    n, lanes = xt.shape
    for i in range(n):
        for c in range(lanes):
            wt[i, c] = abs(xt[i, c])
    make_qkx2_quants(3, xt, wt, Lt, laux, np.float32(-0.5), np.float32(0.1), 15, True, st,
                     st[ROW_SCALES], st[ROW_MINS])
    for b in range(nblocks):
        pack_q2_k_scales(st[ROW_SCALES], st[ROW_MINS], 16 * b, y, yo + Q2_K_BYTES * b,
                         st[ROW_D], st[ROW_DM])
    requantize_levels(xt, Lt, st[ROW_D], st[ROW_DM], 3)
    for b in range(nblocks):
        qs = yo + Q2_K_BYTES * b + 16
        for h in range(2):  # element 128h + 32k + l is sub-block 8h + 2k + l // 16, index l % 16
            for l in range(32):
                c = 16 * b + 8 * h + l // 16
                y[qs + 32 * h + l] = (Lt[l % 16, c] | (Lt[l % 16, c + 2] << 2)
                                      | (Lt[l % 16, c + 4] << 4) | (Lt[l % 16, c + 6] << 6))


@njit(**JIT)
def pack_q3_k_scales(scales, c0, y, yo, d):
    """Q3_K scale bytes and d of one block (sub-blocks c0..c0+15); then d[c] = the rounded
    scale of each sub-block."""
    max_scale = F0
    amax = F0
    for j in range(16):
        if abs(scales[c0 + j]) > amax:
            amax = abs(scales[c0 + j])
            max_scale = scales[c0 + j]
    so = yo + 96
    for k in range(12):
        y[so + k] = 0
    if max_scale != F0:
        iscale = np.float32(-32.0) / max_scale
        for j in range(16):
            l = nearest_int(iscale * scales[c0 + j]) & 0xFF
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
        d[c0 + j] = d_all * np.float32(q3_scale(y, so, j) - 32)


@njit(**JIT)
def quantize_blocks_q3_k(x, xo, y, yo, nblocks, scratch):
    """nblocks (<= BATCH_LANES // 16) Q3_K blocks from x[xo:] to y[yo:]."""
    xt, wt, Lt, laux, st = load_batch(x, xo, nblocks, 16, scratch)
    n, lanes = xt.shape
    make_q3_quants(4, xt, Lt, st, st[ROW_SCALES])
    d = st[ROW_D]
    for b in range(nblocks):
        pack_q3_k_scales(st[ROW_SCALES], 16 * b, y, yo + Q3_K_BYTES * b, d)
    lo, hi = np.float32(-4.0), np.float32(3.0)
    for i in range(n):
        for c in range(lanes):
            fl = clamp_float(nearest_float(xt[i, c] / d[c]), lo, hi)
            Lt[i, c] = np.int32(fl) + 4 if d[c] != F0 else Lt[i, c]
    for b in range(nblocks):
        yb = y[yo + Q3_K_BYTES * b:yo + Q3_K_BYTES * (b + 1)]
        for l in range(32):  # element e = 32m + l lives at Lt[e % 16, 16b + e // 16]
            hm = 0
            q = 0
            for m in range(8):
                lv = Lt[l % 16, 16 * b + 2 * m + l // 16]
                hm |= (1 << m) if lv > 3 else 0
                q |= (lv - 4 if lv > 3 else lv) << (2 * (m % 4))
                if m % 4 == 3:  # qs[32h + l] packs elements 128h + 32k + l, k = 0..3
                    yb[32 + 32 * (m // 4) + l] = q
                    q = 0
            yb[l] = hm


# ---------------------------------------------------------------- Q6_K, block by block

@njit(**JIT)
def new_scratch():
    """Q6_K scratch: levels L[256] and the search's work arrays (make_qx_quants): transposed values, the
    candidates' rows, the sub-blocks' rows, the scales."""
    return (np.empty(QK_K, np.int64), np.empty((16, QX_SUBS), np.float32),
            np.empty((QX_ROWS, LANES * QX_SUBS), np.float32), np.empty((QX_SMALL_ROWS, QX_SUBS), np.float32),
            np.empty(QX_SUBS, np.float32))


@njit(**JIT)
def quantize_block_q6_k(x, xo, y, yo, scratch):
    L, xt, work, small, scales = scratch
    make_qx_quants(32, x, xo, L, xt, work, small, scales)
    max_scale = F0
    max_abs_scale = F0
    for j in range(16):
        s = scales[j]
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


# ---------------------------------------------------------------- parallel row kernels
# Rows are contiguous, so block b of a chunk reads x[b*QK_K:] and writes y[b*bytes:].

@njit(parallel=True, **JIT)
def quantize_q2_k(x, y):
    nb = x.size // QK_K
    batch = BATCH_LANES // 16
    for g in prange((nb + batch - 1) // batch):
        b = g * batch
        quantize_blocks_q2_k(x, b * QK_K, y, b * Q2_K_BYTES, min(batch, nb - b), new_batch_scratch())


@njit(parallel=True, **JIT)
def quantize_q4_k(x, y):
    nb = x.size // QK_K
    batch = BATCH_LANES // 8
    for g in prange((nb + batch - 1) // batch):
        b = g * batch
        quantize_blocks_q4_k(x, b * QK_K, y, b * Q4_K_BYTES, min(batch, nb - b), new_batch_scratch())


@njit(parallel=True, **JIT)
def quantize_q5_k(x, y):
    nb = x.size // QK_K
    batch = BATCH_LANES // 8
    for g in prange((nb + batch - 1) // batch):
        b = g * batch
        quantize_blocks_q5_k(x, b * QK_K, y, b * Q5_K_BYTES, min(batch, nb - b), new_batch_scratch())


@njit(parallel=True, **JIT)
def quantize_q3_k(x, y):
    nb = x.size // QK_K
    batch = BATCH_LANES // 16
    for g in prange((nb + batch - 1) // batch):
        b = g * batch
        quantize_blocks_q3_k(x, b * QK_K, y, b * Q3_K_BYTES, min(batch, nb - b), new_batch_scratch())


@njit(parallel=True, **JIT)
def quantize_q6_k(x, y):
    nb = x.size // QK_K
    for g in prange((nb + GROUP - 1) // GROUP):
        scratch = new_scratch()
        for b in range(g * GROUP, min(nb, (g + 1) * GROUP)):
            quantize_block_q6_k(x, b * QK_K, y, b * Q6_K_BYTES, scratch)
