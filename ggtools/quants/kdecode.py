"""K-quant decoders (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

decode_block_<type>(src, src_offset, out, out_offset) port ggml's dequantize_row_* for one block
(float32 arithmetic in the C order); they need no scratch, so a runtime can call them block by
block. dequantize_<type>(src, out) run them in parallel over flat arrays.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import njit, prange

from .floatbits import JIT, fp16_at

F0 = np.float32(0.0)
U16, U32, U48, U64 = np.uint64(16), np.uint64(32), np.uint64(48), np.uint64(64)
RUN = np.uint64(32)  # values per Q4_K/Q5_K run, handed to the kernels at run time (see below)

QK_K, Q2_K_BYTES = GGML_QUANT_SIZES[T.Q2_K]
Q3_K_BYTES = GGML_QUANT_SIZES[T.Q3_K][1]
Q4_K_BYTES = GGML_QUANT_SIZES[T.Q4_K][1]
Q5_K_BYTES = GGML_QUANT_SIZES[T.Q5_K][1]
Q6_K_BYTES = GGML_QUANT_SIZES[T.Q6_K][1]


@njit(**JIT)
def get_scale_min_k4(j, q, so):
    if j < 4:
        return np.int64(q[so + j]) & 63, np.int64(q[so + j + 4]) & 63
    sc = (np.int64(q[so + j + 4]) & 15) | ((np.int64(q[so + j - 4]) >> 6) << 4)
    m = (np.int64(q[so + j + 4]) >> 4) | ((np.int64(q[so + j]) >> 6) << 4)
    return sc, m


@njit(**JIT)
def q3_scale(src, so, j):
    """6-bit scale j of a Q3_K block (still offset by +32)."""
    low = (np.int64(src[so + j]) & 15) if j < 8 else (np.int64(src[so + j - 8]) >> 4)
    high = (np.int64(src[so + 8 + j % 4]) >> (2 * (j // 4))) & 3
    return low | (high << 4)


# Each decoder walks the block in runs of 16 or 32 values that share one scale, like the C
# code, so the inner loops vectorize (their bounds come from view lengths: LLVM fully unrolls
# loops of a known small count instead of vectorizing them).

@njit(**JIT)
def decode_run_q2(q, shift, dl, ml, ob):
    """ob[l] = dl * ((q[l] >> shift) & 3) - ml."""
    for l in range(ob.shape[0]):
        ob[l] = dl * np.float32(np.int32((np.int32(q[l]) >> shift) & 3)) - ml


@njit(**JIT)
def decode_run_q3(q, shift, hm, hbit, dl, ob):
    """ob[l] = dl * (((q[l] >> shift) & 3) - 4 * (1 - bit hbit of hm[l]))."""
    for l in range(ob.shape[0]):
        low = (np.int32(q[l]) >> shift) & 3
        high = (np.int32(hm[l]) >> hbit) & 1
        ob[l] = dl * np.float32(np.int32(low - ((high ^ 1) << 2)))


@njit(**JIT)
def decode_block_q2_k(src, so, out, oo):
    sb, ob = src[so:so + Q2_K_BYTES], out[oo:oo + QK_K]
    d = fp16_at(sb, 80)
    dmin = fp16_at(sb, 82)
    for j in range(16):  # sub-block j = 8h + 2k + half: bits 2k of qs[32h + 16half + l]
        h, k, half = j // 8, (j // 2) % 4, j % 2
        sc = np.int32(sb[j])
        q = sb[16 + 32 * h + 16 * half:32 + 32 * h + 16 * half]
        decode_run_q2(q, 2 * k, d * np.float32(sc & 15), dmin * np.float32(sc >> 4),
                      ob[16 * j:16 * j + 16])


@njit(**JIT)
def decode_block_q3_k(src, so, out, oo):
    sb, ob = src[so:so + Q3_K_BYTES], out[oo:oo + QK_K]
    d = fp16_at(sb, 108)
    for j in range(16):  # as Q2_K; the high bit of element e is bit e // 32 of hmask[e % 32]
        h, k, half = j // 8, (j // 2) % 4, j % 2
        q = sb[32 + 32 * h + 16 * half:48 + 32 * h + 16 * half]
        decode_run_q3(q, 2 * k, sb[16 * half:16 * half + 16], 4 * h + k,
                      d * np.float32(q3_scale(sb, 96, j) - 32), ob[16 * j:16 * j + 16])


# Q4_K/Q5_K decode a 64-value chunk (two sub-blocks sharing the bytes of qs) per loop, as the C
# code. Offsets and the run length (32) are uint64 and the length arrives at run time: LLVM then
# vectorizes the loops (a known count gets unrolled into scalar code, a signed index gets a
# negative-index test).

@njit(**JIT)
def decode_chunk_q4(src, qo, d1, m1, d2, m2, out, oo, run):
    """out[oo + l] = d1 * (src[qo + l] & 15) - m1, out[oo + run + l] = d2 * (src[qo + l] >> 4) - m2."""
    for l in range(run):
        b = np.int32(src[qo + l])
        out[oo + l] = d1 * np.float32(np.int32(b & 15)) - m1
        out[oo + run + l] = d2 * np.float32(np.int32(b >> 4)) - m2


@njit(**JIT)
def decode_chunk_q5(src, qo, ho, hbit, d1, m1, d2, m2, out, oo, run):
    """As decode_chunk_q4, the 5th bits being bits hbit and hbit + 1 of src[ho + l]."""
    for l in range(run):
        b = np.int32(src[qo + l])
        h = np.int32(src[ho + l]) >> hbit
        out[oo + l] = d1 * np.float32(np.int32((b & 15) | ((h & 1) << 4))) - m1
        out[oo + run + l] = d2 * np.float32(np.int32((b >> 4) | ((h & 2) << 3))) - m2


@njit(**JIT)
def k4_chunk_scales(src, so, c):
    """(d1, m1, d2, m2) of chunk c: the scaled 6-bit scales and mins of sub-blocks 2c, 2c+1."""
    sb = src[so:so + 16]
    d = fp16_at(sb, 0)
    dmin = fp16_at(sb, 2)
    sc1, m1 = get_scale_min_k4(2 * c, sb, 4)
    sc2, m2 = get_scale_min_k4(2 * c + 1, sb, 4)
    return d * np.float32(sc1), dmin * np.float32(m1), d * np.float32(sc2), dmin * np.float32(m2)


@njit(**JIT)
def decode_block_q4_k(src, so, out, oo, run=32):
    """run: 32, best passed as a runtime np.uint64 (see above)."""
    so, oo, run = np.uint64(so), np.uint64(oo), np.uint64(run)
    for c in range(4):
        d1, m1, d2, m2 = k4_chunk_scales(src, so, c)
        cu = np.uint64(c)
        decode_chunk_q4(src, so + U16 + U32 * cu, d1, m1, d2, m2, out, oo + U64 * cu, run)


@njit(**JIT)
def decode_block_q5_k(src, so, out, oo, run=32):
    """run: 32, best passed as a runtime np.uint64 (see above)."""
    so, oo, run = np.uint64(so), np.uint64(oo), np.uint64(run)
    for c in range(4):
        d1, m1, d2, m2 = k4_chunk_scales(src, so, c)
        cu = np.uint64(c)
        decode_chunk_q5(src, so + U48 + U32 * cu, so + U16, 2 * c, d1, m1, d2, m2, out,
                        oo + U64 * cu, run)


@njit(**JIT)
def decode_block_q6_k(src, so, out, oo):
    sb, ob = src[so:so + Q6_K_BYTES], out[oo:oo + QK_K]
    d = fp16_at(sb, 208)
    scales = sb[192:208].view(np.int8)
    for h in range(2):
        ql = sb[64 * h:64 * h + 64]
        qh = sb[128 + 32 * h:160 + 32 * h]
        for k in range(4):  # elements 128h + 32k + l: nibble k // 2 of ql[l + 32 (k % 2)]
            for half in range(2):
                e = 128 * h + 32 * k + 16 * half
                dl = d * np.float32(scales[e // 16])
                low = ql[32 * (k % 2) + 16 * half:32 * (k % 2) + 16 * half + 16]
                high = qh[16 * half:16 * half + 16]
                run = ob[e:e + 16]
                for l in range(run.shape[0]):
                    level = (((np.int32(low[l]) >> (4 * (k // 2))) & 15)
                             | (((np.int32(high[l]) >> (2 * k)) & 3) << 4))
                    run[l] = dl * np.float32(np.int32(level - 32))


@njit(parallel=True, **JIT)
def dequantize_q2_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q2_k(src, b * Q2_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def dequantize_q3_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q3_k(src, b * Q3_K_BYTES, out, b * QK_K)


@njit(parallel=True, **JIT)
def _dequantize_q4_k(src, out, run):
    for b in prange(out.size // QK_K):
        decode_block_q4_k(src, b * Q4_K_BYTES, out, b * QK_K, run)


@njit(parallel=True, **JIT)
def _dequantize_q5_k(src, out, run):
    for b in prange(out.size // QK_K):
        decode_block_q5_k(src, b * Q5_K_BYTES, out, b * QK_K, run)


def dequantize_q4_k(src, out):
    _dequantize_q4_k(src, out, RUN)


def dequantize_q5_k(src, out):
    _dequantize_q5_k(src, out, RUN)


@njit(parallel=True, **JIT)
def dequantize_q6_k(src, out):
    for b in prange(out.size // QK_K):
        decode_block_q6_k(src, b * Q6_K_BYTES, out, b * QK_K)
