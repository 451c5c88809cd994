"""numba matmul kernels: ggml weights dequantized on the fly, numerics equal to llama.cpp's CPU backend.

y[t, r] = W[r] . x[t] for weight rows W kept in their ggml block layout (memory-mapped) and 1 to
many input rows x. Each task decodes a run of weight rows (MatmulPlan.thread_tasks), one at a time, and dots
each with every input row, so a 16-token verify batch reads the weights once. Tasks are split over the
runtime's own workers (workers.py), never numba's prange.

Numerics follow what llama.cpp (x86-64, AVX2 build) does for the weight type, operation for
operation (see ggmlmath for why):
- 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4): the input is quantized to Q8_0 / Q8_1
  (quantize_row_q8_0/1) and the dot is ggml_vec_dot_qX_q8_Y: per block, 8 lanes each holding the
  exact integer dot of 4 consecutive values, accumulated with fma(d_w * d_x, lane, acc), then hsum8.
  tinyBLAS (used by llama.cpp for batches) has the same structure, so these are batch-invariant.
  MXFP4 sums even and odd blocks apart (ggml_vec_dot_mxfp4_q8_0). Q4_0 and MXFP4 matrices that llama.cpp
  repacks (AVX2, rows a multiple of 8: its default extra buffer type CPU_REPACK) are summed as its 8x8
  gemv/gemm kernels sum them, for one row and for batches alike: one fma per block of the block's integer
  sum; see simd.Block32Layout.
  Block values are stored lane-major (position i*8 + lane for value 4*lane + i) so the lane loop
  is unit-stride.
- F32 / F16 / BF16: the input is rounded to the weight's type; one-row products follow
  ggml_vec_dot_f32/f16 (4 accumulators x 8 lanes, reduce4x8), batches follow tinyBLAS (8 lanes,
  hsum8) as llama.cpp does; `stepwise` forces the one-row structure for every row.
- K-quants: the input is rounded through Q8_K. Q4_K and Q6_K are dotted on integers as llama.cpp sums them, bit
  for bit (kquant_dot.py); Q2_K, Q3_K and Q5_K are decoded to float and dotted in the 8-lane structure:
  deterministic and batch-invariant, within float rounding of llama.cpp.

The block decoders are written here rather than called from ggtools.quants' per-block helpers
because LLVM only vectorizes these loops when trip counts are runtime values (a constant 16 is
fully unrolled and the block loop then vectorized with gathers, 3-4x slower) and indices unsigned
(numba adds a negative-index branch to signed ones). So block sizes arrive as uint64 arguments and
offsets stay uint64 (mixing them with signed ints would silently promote to float64). The tests
check every decoder bit-exact against ggtools.quants.dequantize.
"""

import functools

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from numba import carray, cfunc, from_dtype, literal_unroll, njit, types

from ggtools.quants.block32 import KVALUES_MXFP4
from ggtools.quants.floatbits import FP16_TO_F32, f32_from_bits, fp32_to_bf16
from ggtools.runtime.kernels import workers
from ggtools.runtime.kernels.workers import (ARGS, CFUNC, CONTROL_SIZE, ENTRY_SIGNATURE, Job, array_1d, array_2d,
                                             claim, close_job, enter, leave, publish, put_array)
from ggtools.runtime.kernels.ggmlmath import EXACT, fma, to_f16, to_f16_row
from ggtools.runtime.kernels.kquant_dot import (Q4_K_REPACKED, QK_K, ROWS_EXPERT, quantize_q8_k_row, rows_kquant,
                                                rows_mode)
from ggtools.runtime.kernels.simd import (HALF_WIDTH_512, HAVE_AVX2, HAVE_AVX512, HAVE_VNNI, decode_f16_8, q8_0_block,
                                  dot_4x8_main, dot_4x8_stored_1, stored4_lanes8_4, stored4_lanes8_8,
                                  dot_4x8_stored_2, stored2_lanes8_1, stored2_lanes8_2, stored2_lanes8_3,
                                  stored2_lanes8_4, stored4_lanes8_4_ymm,
                                  dot_row_mxfp4_1, dot_row_mxfp4_4,
                                  dot_row_q4_0_1, dot_row_q4_0_4, dot_rows8_q4_0_1, dot_rows8_q4_0_4,
                                  dot_rows8_mxfp4_1, dot_rows8_mxfp4_4,
                                  dot_row_q4_1_1, dot_row_q4_1_4, dot_row_q5_0_1, dot_row_q5_0_4, dot_row_q5_1_1,
                                  dot_row_q5_1_4, dot_row_q8_0_1, dot_row_q8_0_4, dot_row_q4_0_8, dot_row_q4_1_8,
                                  dot_row_q5_0_8, dot_row_q5_1_8, dot_row_q8_0_8, dot_row_mxfp4_8)

MIN_ROWS_PER_TASK = 16     # a multiple of 8: repacked matrices are dotted 8 weight rows at a time
# about two tasks per thread, so each thread streams long runs of weight rows. Claimed in turn, 16-row tasks
# interleave the threads' reads and defeat the hardware prefetcher: on the 2-core VM a decode step's matmuls ran
# slower on 2 threads than on 1, and a 16-row batch's matmuls took 31 ms against 27.7
TASKS_PER_THREAD = 2
MAX_ROWS_PER_TASK = 256    # a multiple of 8 (a task's rows are rounded up to 8)

# how a weight type's input is rounded (its vec_dot_type in ggml-cpu.c)
ACT_F32, ACT_F16, ACT_BF16, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K = range(6)
ACTIVATION = {
    T.F32: ACT_F32, T.F16: ACT_F16, T.BF16: ACT_BF16,
    T.Q4_0: ACT_Q8_0, T.Q4_1: ACT_Q8_1, T.Q5_0: ACT_Q8_0, T.Q5_1: ACT_Q8_1, T.Q8_0: ACT_Q8_0, T.MXFP4: ACT_Q8_0,
    T.Q2_K: ACT_Q8_K, T.Q3_K: ACT_Q8_K, T.Q4_K: ACT_Q8_K, T.Q5_K: ACT_Q8_K, T.Q6_K: ACT_Q8_K,
}
SUPPORTED_TYPES = frozenset(ACTIVATION)
BLOCK32_TYPES = frozenset({T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4})

# type ids as plain ints for the numba dispatch
F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 = (int(t) for t in (
    T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4))
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (int(t) for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K))
# kernel ids: a type summed as llama.cpp's repacked (CPU_REPACK) kernels sum it
Q4_0_REPACKED, MXFP4_REPACKED = 1000 + Q4_0, 1000 + MXFP4
REPACKED_KERNEL = {T.Q4_0: Q4_0_REPACKED, T.MXFP4: MXFP4_REPACKED, T.Q4_K: Q4_K_REPACKED}
INTEGER_KQUANT_KERNELS = frozenset({Q4_K_REPACKED, Q4_K, Q6_K})     # kquant_dot.py's
FIRST_EXPERT = np.zeros(1, np.int64)   # a plain matmul: one group of rows through "expert" 0
ONE_ROW_GROUP = np.array([0, 1], np.int64)   # the group of a one-row input

U = np.uint64
U0, U1, U2, U3, U4, U6, U8, U12, U16, U32 = (U(v) for v in (0, 1, 2, 3, 4, 6, 8, 12, 16, 32))
# lane-major position of value e inside a 32-value block
LANE_POS = np.array([(e % 4) * 8 + e // 4 for e in range(32)], dtype=np.int64)


# ---- block decoders: (src bytes, src offset, dst floats, dst offset, values per block) -----------

@njit(**EXACT)
def fp16_at(src, o):
    return FP16_TO_F32[np.int64(src[o]) | (np.int64(src[o + U1]) << 8)]


@njit(**EXACT)
def u32_at(src, o):
    return U(src[o]) | (U(src[o + U1]) << U8) | (U(src[o + U2]) << U16) | (U(src[o + U3]) << U(24))


@njit(**EXACT)
def decode_q4_0(src, so, dst, do, qk):
    half = qk >> U1
    d = fp16_at(src, so)
    qs = so + U2
    for j in range(half):
        v = np.int64(src[qs + j])
        dst[do + j] = np.float32((v & 15) - 8) * d
        dst[do + half + j] = np.float32((v >> 4) - 8) * d


@njit(**EXACT)
def decode_q4_1(src, so, dst, do, qk):
    half = qk >> U1
    d = fp16_at(src, so)
    m = fp16_at(src, so + U2)
    qs = so + U4
    for j in range(half):
        v = np.int64(src[qs + j])
        dst[do + j] = np.float32(v & 15) * d + m
        dst[do + half + j] = np.float32(v >> 4) * d + m


@njit(**EXACT)
def decode_q5_0(src, so, dst, do, qk):
    half = qk >> U1
    d = fp16_at(src, so)
    qh = u32_at(src, so + U2)
    qs = so + U6
    for j in range(half):
        v = U(src[qs + j])
        lo = (v & U(15)) | (((qh >> j) << U4) & U16)
        hi = (v >> U4) | ((qh >> (j + U12)) & U16)
        dst[do + j] = np.float32(np.int64(lo) - 16) * d
        dst[do + half + j] = np.float32(np.int64(hi) - 16) * d


@njit(**EXACT)
def decode_q5_1(src, so, dst, do, qk):
    half = qk >> U1
    d = fp16_at(src, so)
    m = fp16_at(src, so + U2)
    qh = u32_at(src, so + U4)
    qs = so + U8
    for j in range(half):
        v = U(src[qs + j])
        lo = (v & U(15)) | (((qh >> j) << U4) & U16)
        hi = (v >> U4) | ((qh >> (j + U12)) & U16)
        dst[do + j] = np.float32(lo) * d + m
        dst[do + half + j] = np.float32(hi) * d + m


@njit(**EXACT)
def decode_q8_0(src, so, dst, do, qk):
    d = fp16_at(src, so)
    qs = so + U2
    for j in range(qk):
        q = np.int64(src[qs + j])
        dst[do + j] = np.float32(q - ((q & 128) << 1)) * d


@njit(**EXACT)
def decode_mxfp4(src, so, dst, do, qk):
    half = qk >> U1
    e = np.int64(src[so])
    d = f32_from_bits((0x00200000 << e) if e < 2 else ((e - 1) << 23))
    qs = so + U1
    for j in range(half):
        v = np.int64(src[qs + j])
        dst[do + j] = KVALUES_MXFP4[v & 15] * d
        dst[do + half + j] = KVALUES_MXFP4[v >> 4] * d


@njit(**EXACT)
def decode_q2_k(src, so, dst, do, qk):
    n16 = qk >> U4  # 16 values per scale
    n32 = qk >> U3  # 32 bytes of 2-bit values per half
    d = fp16_at(src, so + U(80))
    dmin = fp16_at(src, so + U(82))
    sc_at = so
    for half in range(U2):
        qs = so + U16 + half * n32
        for k in range(U4):
            shift = k * U2
            for s in range(U2):
                sc = np.int64(src[sc_at])
                sc_at += U1
                dl = d * np.float32(sc & 15)
                ml = dmin * np.float32(sc >> 4)
                out = do + half * U(128) + k * U32 + s * U16
                q = qs + s * U16
                for l in range(n16):
                    dst[out + l] = dl * np.float32((np.int64(src[q + l]) >> shift) & 3) - ml


@njit(**EXACT)
def decode_q3_k(src, so, dst, do, qk):
    n16 = qk >> U4
    d = fp16_at(src, so + U(108))
    a0 = u32_at(src, so + U(96))
    a1 = u32_at(src, so + U(100))
    tmp = u32_at(src, so + U(104))
    m2, m4 = U(0x03030303), U(0x0F0F0F0F)
    packed = ((a0 & m4) | (((tmp >> U0) & m2) << U4),
              (a1 & m4) | (((tmp >> U2) & m2) << U4),
              ((a0 >> U4) & m4) | (((tmp >> U4) & m2) << U4),
              ((a1 >> U4) & m4) | (((tmp >> U6) & m2) << U4))
    is_ = 0
    for half in range(U2):
        qs = so + U32 + half * U32
        for k in range(U4):
            shift = k * U2
            mask = np.int64(1) << np.int64(half * U4 + k)
            for s in range(U2):
                word = packed[is_ >> 2]
                scale = np.int64((word >> U(8 * (is_ & 3))) & U(255)) - 32
                is_ += 1
                dl = d * np.float32(scale)
                out = do + half * U(128) + k * U32 + s * U16
                q = qs + s * U16
                hm = so + s * U16
                for l in range(n16):
                    low = (np.int64(src[q + l]) >> shift) & 3
                    high = 0 if np.int64(src[hm + l]) & mask else 4
                    dst[out + l] = dl * np.float32(low - high)


@njit(**EXACT)
def scale_min_k4(src, so, j):
    """get_scale_min_k4: the 6-bit scale and min of sub-block j from the 12 packed bytes."""
    if j < 4:
        return np.int64(src[so + U(j)]) & 63, np.int64(src[so + U(j + 4)]) & 63
    sc = (np.int64(src[so + U(j + 4)]) & 15) | ((np.int64(src[so + U(j - 4)]) >> 6) << 4)
    m = (np.int64(src[so + U(j + 4)]) >> 4) | ((np.int64(src[so + U(j)]) >> 6) << 4)
    return sc, m


@njit(**EXACT)
def decode_q4_k(src, so, dst, do, qk):
    n32 = qk >> U3
    d = fp16_at(src, so)
    dmin = fp16_at(src, so + U2)
    for c in range(4):
        sc1, m1 = scale_min_k4(src, so + U4, 2 * c)
        sc2, m2 = scale_min_k4(src, so + U4, 2 * c + 1)
        d1, mm1 = d * np.float32(sc1), dmin * np.float32(m1)
        d2, mm2 = d * np.float32(sc2), dmin * np.float32(m2)
        qs = so + U16 + U(c) * U32
        out = do + U(c) * U(64)
        for l in range(n32):
            v = np.int64(src[qs + l])
            dst[out + l] = d1 * np.float32(v & 15) - mm1
            dst[out + n32 + l] = d2 * np.float32(v >> 4) - mm2


@njit(**EXACT)
def decode_q5_k(src, so, dst, do, qk):
    n32 = qk >> U3
    d = fp16_at(src, so)
    dmin = fp16_at(src, so + U2)
    qh = so + U16
    for c in range(4):
        sc1, m1 = scale_min_k4(src, so + U4, 2 * c)
        sc2, m2 = scale_min_k4(src, so + U4, 2 * c + 1)
        d1, mm1 = d * np.float32(sc1), dmin * np.float32(m1)
        d2, mm2 = d * np.float32(sc2), dmin * np.float32(m2)
        qs = so + U(48) + U(c) * U32
        out = do + U(c) * U(64)
        for l in range(n32):
            v = np.int64(src[qs + l])
            h = np.int64(src[qh + l]) >> (2 * c)
            dst[out + l] = d1 * np.float32((v & 15) + ((h & 1) << 4)) - mm1
            dst[out + n32 + l] = d2 * np.float32((v >> 4) + ((h & 2) << 3)) - mm2


@njit(**EXACT)
def decode_q6_k(src, so, dst, do, qk):
    n32 = qk >> U3
    d = fp16_at(src, so + U(208))
    for half in range(U2):
        ql = so + half * U(64)
        qh = so + U(128) + half * U32
        sc = so + U(192) + half * U8
        out = do + half * U(128)
        for g in range(U2):  # l < 16 and l >= 16 use different scales
            s0 = d * np.float32(np.int64(np.int8(src[sc + g])))
            s2 = d * np.float32(np.int64(np.int8(src[sc + g + U2])))
            s4 = d * np.float32(np.int64(np.int8(src[sc + g + U4])))
            s6 = d * np.float32(np.int64(np.int8(src[sc + g + U6])))
            base = g * (n32 >> U1)
            for i in range(n32 >> U1):
                l = base + i
                a = np.int64(src[ql + l])
                b = np.int64(src[ql + U32 + l])
                h = np.int64(src[qh + l])
                dst[out + l] = s0 * np.float32(((a & 15) | ((h & 3) << 4)) - 32)
                dst[out + U32 + l] = s2 * np.float32(((b & 15) | (((h >> 2) & 3) << 4)) - 32)
                dst[out + U(64) + l] = s4 * np.float32(((a >> 4) | (((h >> 4) & 3) << 4)) - 32)
                dst[out + U(96) + l] = s6 * np.float32(((b >> 4) | (((h >> 6) & 3) << 4)) - 32)


@njit(**EXACT)
def decode_f16(src, so, dst, do, n):
    for j in range(n):
        o = so + j * U2
        dst[do + j] = fp16_at(src, o)


@njit(inline="always", **EXACT)
def decode_f16_row(src, so, dst, n):
    """A whole row from offset 0 of dst: 8 values per vector conversion, the tail through the table."""
    n8 = n >> U3
    decode_f16_8(src, so, dst, n8)
    decode_f16(src, so + (n8 << U4), dst, n8 << U3, n - (n8 << U3))


@njit(**EXACT)
def decode_bf16(src, so, dst, do, n):
    for j in range(n):
        o = so + j * U2
        dst[do + j] = f32_from_bits((np.int64(src[o]) << 16) | (np.int64(src[o + U1]) << 24))


@njit(**EXACT)
def decode_f32(src, so, dst, do, n):
    for j in range(n):
        o = so + j * U4
        dst[do + j] = f32_from_bits(np.int64(src[o]) | (np.int64(src[o + U1]) << 8)
                                    | (np.int64(src[o + U2]) << 16) | (np.int64(src[o + U3]) << 24))


@njit(inline="always", **EXACT)
def decode_row(qtype, src, so, dst, qk, block_bytes):
    """Decode one row (dst.size values) starting at byte so."""
    n = U(dst.size)
    if qtype == F32:
        decode_f32(src, so, dst, U0, n)
        return
    if qtype == F16:
        decode_f16_row(src, so, dst, n)
        return
    if qtype == BF16:
        decode_bf16(src, so, dst, U0, n)
        return
    for b in range(n // qk):
        bo = so + b * block_bytes
        do = b * qk
        if qtype == Q4_0:
            decode_q4_0(src, bo, dst, do, qk)
        elif qtype == Q4_1:
            decode_q4_1(src, bo, dst, do, qk)
        elif qtype == Q5_0:
            decode_q5_0(src, bo, dst, do, qk)
        elif qtype == Q5_1:
            decode_q5_1(src, bo, dst, do, qk)
        elif qtype == Q8_0:
            decode_q8_0(src, bo, dst, do, qk)
        elif qtype == MXFP4:
            decode_mxfp4(src, bo, dst, do, qk)
        elif qtype == Q2_K:
            decode_q2_k(src, bo, dst, do, qk)
        elif qtype == Q3_K:
            decode_q3_k(src, bo, dst, do, qk)
        elif qtype == Q4_K:
            decode_q4_k(src, bo, dst, do, qk)
        elif qtype == Q5_K:
            decode_q5_k(src, bo, dst, do, qk)
        elif qtype == Q6_K:
            decode_q6_k(src, bo, dst, do, qk)




# ---- 32-value block types as exact integers, lane-major ------------------------------------------

@njit(**EXACT)
def quantize_q8_row(x, xq, xd, xs):
    """quantize_row_q8_0 / q8_1, x86 AVX2 path (id = 127/amax, round half to even), for one row:
    xq the integer values (int8 in value order for the AVX2 kernels, else float32 lane-major per
    block), xd the fp16 scales, xs (Q8_1 only, may be empty) the fp16 block sums s = d * sum(q)
    with d before its rounding. amax is taken on the bits, |x| as an unsigned integer (ordered as |x| is): a NaN's
    bits exceed inf's, so a block holding one gets a NaN scale and its row NaN outputs, which the logits check
    stops (a float max skipped it, and the NaN became some integer); the integer max also runs faster (16 rows of
    1024: 1.23 ns a value against 1.47)."""
    if HAVE_AVX2 and x.strides[0] == 4 and xq.strides[0] == 1:
        for b in range(x.size // 32):
            xd[b], s = q8_0_block(x, b * 32, xq)
            if xs.size:
                xs[b] = s
        return
    bits = x.view(np.uint32)
    for b in range(x.size // 32):
        o = b * 32
        abs_max = np.uint32(0)
        for j in range(32):
            abs_max = max(abs_max, bits[o + j] & np.uint32(0x7FFFFFFF))
        amax = f32_from_bits(abs_max)
        d = amax / np.float32(127.0)
        inv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
        q_sum = 0
        for e in range(32):
            q = np.rint(x[o + e] * inv)
            # an inf or NaN product (amax under 127 / FLT_MAX makes inv inf): cvtps2dq's INT_MIN, which ggml sums as
            # int32 and packs (saturating) to -128
            qi = np.int32(q) if abs(q) <= np.float32(127.0) else np.int32(-2147483648)
            q_sum += qi
            q8 = np.int8(qi) if qi >= -128 else np.int8(-128)
            if HAVE_AVX2:
                xq[o + e] = q8
            else:
                xq[o + LANE_POS[e]] = q8
        xd[b] = to_f16(d)
        if xs.size:
            xs[b] = to_f16(d * np.float32(np.int32(q_sum)))


# ---- float dot structures ------------------------------------------------------------------------

@njit(inline="always", **EXACT)
def dot_one_row(w, x, t, f16_tail):
    """ggml_vec_dot_f32 / ggml_vec_dot_f16 (AVX2) of w with x[t]: 4 accumulators of 8 lanes over
    steps of 32, reduce4x8, then leftovers (float fma for f32, float64 sum for f16)."""
    n_main = w.size // 32 * 32
    s = dot_4x8_main(w, x, t, n_main)
    if f16_tail:
        total = np.float64(s)
        for k in range(n_main, w.size):
            total += np.float64(w[k] * x[t, k])
        return np.float32(total)
    for k in range(n_main, w.size):
        s = fma(w[k], x[t, k], s)
    return s


# ---- activations ---------------------------------------------------------------------------------

@njit(**EXACT)
def prepare_q8_k_rows(x, values, q8, xd, bsums):
    """Each row through Q8_K (kquant_dot.quantize_q8_k_row) and back to float values q * d (the float path's)."""
    if x.strides[1] != 4:
        x = x.copy()
    for t in range(x.shape[0]):
        quantize_q8_k_row(x[t], q8[t], xd[t], bsums[t], values[t])


@njit(**EXACT)
def prepare_rows(kind, x, xq, xd, xs):
    """Round each input row for a weight type: Q8_0/Q8_1 into (xq, xd, xs); others into xq."""
    for t in range(x.shape[0]):
        src, dst = x[t], xq[t]
        if kind == ACT_Q8_0 or kind == ACT_Q8_1:
            quantize_q8_row(src, dst, xd[t], xs[t])
        elif kind == ACT_F16:
            to_f16_row(src, dst)
        elif kind == ACT_BF16:
            for j in range(src.size):
                dst[j] = f32_from_bits(fp32_to_bf16(src[j]) << 16)
        else:
            dst[:] = src


@njit(**EXACT)
def batch_forms(xq, xd):
    """What the 4- and 8-row block dots take besides xq and xd (simd._dot_row_block32_with): xc[t, 8b + l] = -128 *
    the sum of xq[t, 32b + 4l:32b + 4l + 4] (VNNI only; else no columns), and xdT[b, t] = xd[t, b]."""
    n_in, n_blocks = xd.shape
    xc = np.empty((n_in, 8 * n_blocks if HAVE_VNNI else 0), np.int32)
    xdT = np.empty((n_blocks, n_in), np.float32)
    for t in range(xc.shape[0]):
        for k in range(xc.shape[1]):
            o = 4 * k
            xc[t, k] = -128 * (np.int32(xq[t, o]) + np.int32(xq[t, o + 1]) + np.int32(xq[t, o + 2]) +
                               np.int32(xq[t, o + 3]))
    for b in range(xdT.shape[0]):
        for t in range(n_in):
            xdT[b, t] = xd[t, b]
    return xc, xdT


# ---- matmul --------------------------------------------------------------------------------------

# Each type's task loop is its own (not inlined) function: one kernel holding every type's inlined dots ran
# its hot loop 1.7x slower (measured on one-row Q8_0 matmuls: 2.2-2.4 against 1.3-1.6 ns per block). They are
# written out, not made by a factory closing over the simd dots: numba keys a closure's cache on its pickled
# cells, and an intrinsic pickles with a uuid made per process, so such loops would never load from the cache.
@njit(**EXACT)
def rows_q4_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, i < n_rows, t0 <= t < t1: eight, then
    four input rows per decode of a weight row, then one at a time (ggml_vec_dot_q4_0_q8_*'s sums)."""
    for i in range(n_rows):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 8 <= t1:
            sums = dot_row_q4_0_8(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            for j in range(8):
                out[t + j, r] = sums[j]
            t += 8
        while t + 4 <= t1:
            sums4 = dot_row_q4_0_4(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = sums4
            t += 4
        while t < t1:
            (out[t, r],) = dot_row_q4_0_1(buf, so, n_blocks, xq, xd, xs, t)
            t += 1


@njit(**EXACT)
def rows_q4_1(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, i < n_rows, t0 <= t < t1: eight, then
    four input rows per decode of a weight row, then one at a time (ggml_vec_dot_q4_1_q8_*'s sums)."""
    for i in range(n_rows):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 8 <= t1:
            sums = dot_row_q4_1_8(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            for j in range(8):
                out[t + j, r] = sums[j]
            t += 8
        while t + 4 <= t1:
            sums4 = dot_row_q4_1_4(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = sums4
            t += 4
        while t < t1:
            (out[t, r],) = dot_row_q4_1_1(buf, so, n_blocks, xq, xd, xs, t)
            t += 1


@njit(**EXACT)
def rows_q5_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, i < n_rows, t0 <= t < t1: eight, then
    four input rows per decode of a weight row, then one at a time (ggml_vec_dot_q5_0_q8_*'s sums)."""
    for i in range(n_rows):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 8 <= t1:
            sums = dot_row_q5_0_8(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            for j in range(8):
                out[t + j, r] = sums[j]
            t += 8
        while t + 4 <= t1:
            sums4 = dot_row_q5_0_4(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = sums4
            t += 4
        while t < t1:
            (out[t, r],) = dot_row_q5_0_1(buf, so, n_blocks, xq, xd, xs, t)
            t += 1


@njit(**EXACT)
def rows_q5_1(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, i < n_rows, t0 <= t < t1: eight, then
    four input rows per decode of a weight row, then one at a time (ggml_vec_dot_q5_1_q8_*'s sums)."""
    for i in range(n_rows):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 8 <= t1:
            sums = dot_row_q5_1_8(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            for j in range(8):
                out[t + j, r] = sums[j]
            t += 8
        while t + 4 <= t1:
            sums4 = dot_row_q5_1_4(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = sums4
            t += 4
        while t < t1:
            (out[t, r],) = dot_row_q5_1_1(buf, so, n_blocks, xq, xd, xs, t)
            t += 1


@njit(**EXACT)
def rows_q8_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, i < n_rows, t0 <= t < t1: eight, then
    four input rows per decode of a weight row, then one at a time (ggml_vec_dot_q8_0_q8_*'s sums)."""
    for i in range(n_rows):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 8 <= t1:
            sums = dot_row_q8_0_8(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            for j in range(8):
                out[t + j, r] = sums[j]
            t += 8
        while t + 4 <= t1:
            sums4 = dot_row_q8_0_4(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = sums4
            t += 4
        while t < t1:
            (out[t, r],) = dot_row_q8_0_1(buf, so, n_blocks, xq, xd, xs, t)
            t += 1


@njit(**EXACT)
def rows_mxfp4(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1):
    """out[t, column + i] = weight row i (from buf[offset] on) . input row t, i < n_rows, t0 <= t < t1: eight, then
    four input rows per decode of a weight row, then one at a time (ggml_vec_dot_mxfp4_q8_*'s sums)."""
    for i in range(n_rows):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 8 <= t1:
            sums = dot_row_mxfp4_8(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            for j in range(8):
                out[t + j, r] = sums[j]
            t += 8
        while t + 4 <= t1:
            sums4 = dot_row_mxfp4_4(buf, so, n_blocks, xq, xd, xs, t, xc, xdT)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = sums4
            t += 4
        while t < t1:
            (out[t, r],) = dot_row_mxfp4_1(buf, so, n_blocks, xq, xd, xs, t)
            t += 1


@njit(**EXACT)
def rows8_q4_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, out, column, t0, t1):
    """As rows_q4_0 for a matrix llama.cpp repacks: 8 weight rows at a time, summed as its 8x8 gemm (4 input rows)
    and gemv (the rest) sum them; n_rows a multiple of 8."""
    for i in range(0, n_rows, 8):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 4 <= t1:
            sums = dot_rows8_q4_0_4(buf, so, n_blocks, xq, xd, xs, t)
            for j in range(4):
                for k in range(8):
                    out[t + j, r + k] = sums[j * 8 + k]
            t += 4
        while t < t1:
            one = dot_rows8_q4_0_1(buf, so, n_blocks, xq, xd, xs, t)
            for k in range(8):
                out[t, r + k] = one[k]
            t += 1


@njit(**EXACT)
def rows8_mxfp4(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, out, column, t0, t1):
    """As rows_mxfp4 for a matrix llama.cpp repacks: 8 weight rows at a time, summed as its 8x8 gemm (4 input rows)
    and gemv (the rest) sum them; n_rows a multiple of 8."""
    for i in range(0, n_rows, 8):
        so = offset + U(i) * row_bytes
        r = column + i
        t = t0
        while t + 4 <= t1:
            sums = dot_rows8_mxfp4_4(buf, so, n_blocks, xq, xd, xs, t)
            for j in range(4):
                for k in range(8):
                    out[t + j, r + k] = sums[j * 8 + k]
            t += 4
        while t < t1:
            one = dot_rows8_mxfp4_1(buf, so, n_blocks, xq, xd, xs, t)
            for k in range(8):
                out[t, r + k] = one[k]
            t += 1


@njit(inline="always", **EXACT)
def task_at(tasks, experts, groups, k):
    """Task k of a plan's task loop: (byte offset of its first weight row, its rows, their output column, the first
    and one past the last input row of its group)."""
    n_template = tasks.shape[0]
    g, j = k // n_template, k % n_template
    return U(tasks[j, 0] + experts[g] * tasks[j, 3]), tasks[j, 1], tasks[j, 2], groups[g], groups[g + 1]


# One compiled version of each task loop, its fast-path post and plan_rows. Numba compiles a kernel once for each
# set of argument types it is called with, and its callers' arrays differ in flags alone: weights are read-only file
# mappings from Python but writable in the workers' entries (carray), FIRST_EXPERT read-only where numba code names
# it (a global) but writable from Python, constants from numba literals. A cold run (CI's) compiled up to four
# versions of each, seconds apiece. So these take explicit signatures that every caller's arguments convert to:
# weights, experts and groups read-only, the rest as all callers pass them (C-contiguous, writable).
XQ_DTYPE = np.int8 if HAVE_AVX2 else np.float32     # the block32 input's values (PreparedInput)
WEIGHTS = types.Array(types.uint8, 1, "C", readonly=True)
INDEX = types.Array(types.int64, 1, "C", readonly=True)     # experts, groups
XQ = types.Array(from_dtype(XQ_DTYPE), 2, "C")
F32_2, I8_2, I32_2, I64_2 = types.float32[:, ::1], types.int8[:, ::1], types.int32[:, ::1], types.int64[:, ::1]
COUNTER = types.int64[::1]
I64, U64, BOOL = types.int64, types.uint64, types.boolean
BLOCK32_ARGS = (I64, U64, U64, WEIGHTS, XQ, F32_2, F32_2, F32_2, I64_2, INDEX, INDEX)
FLOAT_ARGS = (I64, U64, U64, U64, WEIGHTS, F32_2, F32_2, I64_2, INDEX, INDEX, BOOL, BOOL)
KQUANT_ARGS = (I64, I64, WEIGHTS, I8_2, F32_2, I32_2, F32_2, I64_2, INDEX, INDEX, I64)
# MatmulPlan.call_args
PLAN = types.Tuple((I64, I64, I64, U64, U64, U64, WEIGHTS, XQ, F32_2, F32_2, F32_2, I64_2, F32_2, I64, BOOL, I8_2,
                    I32_2))


@njit([BLOCK32_ARGS + (COUNTER,)], **EXACT)
def matmul_block32(qtype, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts, groups, counter):
    """Task k = (group g, template task j): template tasks (byte offset of a weight row in buf, rows, output
    column, bytes per expert), claimed through counter (workers.py): out[t, column + i] = weight row i of
    expert experts[g] . input row t, for the input rows of group g, groups[g] <= t < groups[g + 1]
    (a plain matmul is one group of all rows through expert 0). Repacked kinds take weight rows 8 at a time (their
    matrices' row counts, and so every task's, are multiples of 8)."""
    n_blocks = xq.shape[1] // 32
    if xq.shape[0] >= 4:
        xc, xdT = batch_forms(xq, xd)
    else:                   # never read: no group reaches the 4-row dots (and nothing is allocated per step)
        xc, xdT = xd.view(np.int32), xd
    enter(counter)
    while True:
        k = claim(counter)
        if k >= tasks.shape[0] * experts.size:
            break
        offset, n_rows, column, t0, t1 = task_at(tasks, experts, groups, k)
        if qtype == Q4_0_REPACKED:
            rows8_q4_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, out, column, t0, t1)
        elif qtype == MXFP4_REPACKED:
            rows8_mxfp4(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, out, column, t0, t1)
        elif qtype == Q4_0:
            rows_q4_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1)
        elif qtype == Q4_1:
            rows_q4_1(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1)
        elif qtype == Q5_0:
            rows_q5_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1)
        elif qtype == Q5_1:
            rows_q5_1(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1)
        elif qtype == MXFP4:
            rows_mxfp4(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1)
        else:
            rows_q8_0(buf, offset, row_bytes, n_rows, n_blocks, xq, xd, xs, xc, xdT, out, column, t0, t1)
    leave(counter)


@njit([FLOAT_ARGS + (COUNTER,)], **EXACT)
def matmul_float(qtype, qk, block_bytes, row_bytes, buf, x_all, out_all, tasks, experts, groups, one_row_structure,
                 f16_tail, counter):
    """As matmul_block32 for weights dotted in float: in vec_dot's layout (one_row_structure: four 8-lane
    accumulators over steps of 32, input rows in pairs sharing the weight loads) or tinyBLAS's (8 lanes, two
    weight rows at a time against up to four input rows, every load of an input row serving both). F16 and F32
    rows are read straight from the file, as ggml's dots read them; other types are decoded to float first.
    The loops are written out here: behind helpers taking the arrays they ran about 3x slower."""
    n = x_all.shape[1]
    decoded = np.empty(2 * n * 4, np.uint8)            # two decoded rows, as float32 bytes
    w = decoded.view(np.float32).reshape((2, n))
    w0, w1 = w[0], w[1]
    direct = qtype == F16 or qtype == F32
    f16 = qtype == F16
    tail = n % (32 if one_row_structure else 8) != 0   # vec_dot's leftover loop (its own summation)
    # with AVX-512, tinyBLAS's layout takes four weight rows at a time against groups of 8, then 4 input rows
    # (stored4_lanes8_8 / _4; on Zen 4, groups of 4 on 8-lane vectors: simd.HALF_WIDTH_512), and the pair kernels
    # the input rows left
    quads = HAVE_AVX512 and direct and not one_row_structure and not tail
    enter(counter)
    while True:
        k = claim(counter)
        if k >= tasks.shape[0] * experts.size:
            break
        offset, n_rows, column, t0, t1 = task_at(tasks, experts, groups, k)
        x, out = x_all[t0:t1], out_all[t0:t1]
        n_in = x.shape[0]
        i = 0
        quad_end, quad_rows = 0, 0     # weight rows below quad_end are done for input rows below quad_rows
        while i < n_rows:
            r = column + i
            if quads and i >= quad_end and i + 4 <= n_rows and n_in >= 4:
                so, t = offset + U(i) * row_bytes, 0
                while not HALF_WIDTH_512 and t + 8 <= n_in:
                    d32 = stored4_lanes8_8(buf, so, row_bytes, f16, x, t)
                    for k in range(4):
                        for q in range(8):
                            out[t + q, r + k] = d32[8 * k + q]
                    t += 8
                while t + 4 <= n_in:
                    d16 = stored4_lanes8_4_ymm(buf, decoded, False, so, row_bytes, f16, x, t) if HALF_WIDTH_512 \
                        else stored4_lanes8_4(buf, so, row_bytes, f16, x, t)
                    for k in range(4):
                        for q in range(4):
                            out[t + q, r + k] = d16[4 * k + q]
                    t += 4
                quad_end, quad_rows = i + 4, t
                if t == n_in:
                    i += 4
                    continue
            if tail:
                decode_row(qtype, buf, offset + U(i) * row_bytes, w0, qk, block_bytes)
                for t in range(n_in):
                    out[t, r] = dot_one_row(w0, x, t, f16_tail)
                i += 1
                continue
            # tinyBLAS's layout takes two weight rows; a lone last one goes as a pair with itself (stride 0)
            pair = not one_row_structure and i + 1 < n_rows
            if direct:
                so, stride = offset + U(i) * row_bytes, row_bytes if pair else U0
            else:
                decode_row(qtype, buf, offset + U(i) * row_bytes, w0, qk, block_bytes)
                if pair:
                    decode_row(qtype, buf, offset + U(i + 1) * row_bytes, w1, qk, block_bytes)
                so, stride = U0, U(4 * n) if pair else U0
            t = quad_rows if i < quad_end else 0
            if one_row_structure:
                while t + 2 <= n_in:
                    out[t, r], out[t + 1, r] = dot_4x8_stored_2(buf, decoded, not direct, so, f16, x, t, n)
                    t += 2
                if t < n_in:
                    (out[t, r],) = dot_4x8_stored_1(buf, decoded, not direct, so, f16, x, t, n)
                i += 1
                continue
            while t + 4 <= n_in:
                d4 = stored2_lanes8_4(buf, decoded, not direct, so, stride, f16, x, t)
                for q in range(4):
                    out[t + q, r] = d4[q]
                    if pair:
                        out[t + q, r + 1] = d4[4 + q]
                t += 4
            left = n_in - t     # the rest in one group (3 of a drafter's 7 rows): lone rows would wait on fma latency
            if left == 3:
                d3 = stored2_lanes8_3(buf, decoded, not direct, so, stride, f16, x, t)
                for q in range(3):
                    out[t + q, r] = d3[q]
                    if pair:
                        out[t + q, r + 1] = d3[3 + q]
            elif left == 2:
                d2 = stored2_lanes8_2(buf, decoded, not direct, so, stride, f16, x, t)
                for q in range(2):
                    out[t + q, r] = d2[q]
                    if pair:
                        out[t + q, r + 1] = d2[2 + q]
            elif left == 1:
                d1 = stored2_lanes8_1(buf, decoded, not direct, so, stride, f16, x, t)
                out[t, r] = d1[0]
                if pair:
                    out[t, r + 1] = d1[1]
            i += 2 if pair else 1
    leave(counter)


@njit([KQUANT_ARGS + (COUNTER,)], **EXACT)
def matmul_kquant(kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, mode, counter):
    """matmul_block32's task loop for the integer K-quant kernels (kquant_dot.rows_kquant), each group of input rows
    as llama.cpp runs it (mode: kquant_dot.ROWS_*; a group is one mul_mat's rows or one expert's)."""
    n_blocks = q8.shape[1] // QK_K
    enter(counter)
    while True:
        k = claim(counter)
        if k >= tasks.shape[0] * experts.size:
            break
        offset, n_rows, column, t0, t1 = task_at(tasks, experts, groups, k)
        rows_kquant(kernel, buf, offset, row_bytes, n_rows, n_blocks, q8, xd, bsums, out, column, t0, t1, mode)
    leave(counter)


# ---- the matmuls on the workers' fast path (workers.py): arguments through the control array -------------

@njit(**EXACT)
def contiguous(*arrays):
    ok = True
    for a in literal_unroll(arrays):
        ok = ok and a.flags.c_contiguous
    return ok


@njit([(COUNTER, I64) + BLOCK32_ARGS], **EXACT)
def matmul_block32_post(control, entry, qtype, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts, groups):
    if not contiguous(buf, xq, xd, xs, out, tasks, experts, groups):
        matmul_block32(qtype, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts, groups, np.zeros(2, np.int64))
        return
    control[ARGS], control[ARGS + 1], control[ARGS + 2] = qtype, np.int64(block_bytes), np.int64(row_bytes)
    i = put_array(control, put_array(control, put_array(control, ARGS + 3, xd), xs), out)
    i = put_array(control, put_array(control, i, buf), xq)
    i = put_array(control, put_array(control, put_array(control, i, tasks), experts), groups)
    publish(control, entry)
    matmul_block32(qtype, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts, groups, control[0:2])
    close_job(control)


@cfunc(ENTRY_SIGNATURE, **CFUNC)
def matmul_block32_entry(address):
    control = carray(address, (CONTROL_SIZE,))
    qtype, block_bytes, row_bytes = control[ARGS], U(control[ARGS + 1]), U(control[ARGS + 2])
    xd, i = array_2d(control, ARGS + 3, np.float32)
    xs, i = array_2d(control, i, np.float32)
    out, i = array_2d(control, i, np.float32)
    buf, i = array_1d(control, i, np.uint8)
    xq, i = array_2d(control, i, XQ_DTYPE)
    tasks, i = array_2d(control, i, np.int64)
    experts, i = array_1d(control, i, np.int64)
    groups, i = array_1d(control, i, np.int64)
    matmul_block32(qtype, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts, groups, control[0:2])


@njit([(COUNTER, I64) + FLOAT_ARGS], **EXACT)
def matmul_float_post(control, entry, qtype, qk, block_bytes, row_bytes, buf, x_all, out_all, tasks, experts, groups,
                      one_row_structure, f16_tail):
    if not contiguous(buf, x_all, out_all, tasks, experts, groups):
        matmul_float(qtype, qk, block_bytes, row_bytes, buf, x_all, out_all, tasks, experts, groups,
                     one_row_structure, f16_tail, np.zeros(2, np.int64))
        return
    control[ARGS], control[ARGS + 1], control[ARGS + 2] = qtype, np.int64(qk), np.int64(block_bytes)
    control[ARGS + 3], control[ARGS + 4], control[ARGS + 5] = np.int64(row_bytes), one_row_structure, f16_tail
    i = put_array(control, put_array(control, ARGS + 6, x_all), out_all)
    i = put_array(control, put_array(control, put_array(control, put_array(control, i, buf), tasks), experts), groups)
    publish(control, entry)
    matmul_float(qtype, qk, block_bytes, row_bytes, buf, x_all, out_all, tasks, experts, groups, one_row_structure,
                 f16_tail, control[0:2])
    close_job(control)


@cfunc(ENTRY_SIGNATURE, **CFUNC)
def matmul_float_entry(address):
    control = carray(address, (CONTROL_SIZE,))
    qtype, qk, block_bytes, row_bytes = control[ARGS], U(control[ARGS + 1]), U(control[ARGS + 2]), U(control[ARGS + 3])
    one_row_structure, f16_tail = control[ARGS + 4] != 0, control[ARGS + 5] != 0
    x_all, i = array_2d(control, ARGS + 6, np.float32)
    out_all, i = array_2d(control, i, np.float32)
    buf, i = array_1d(control, i, np.uint8)
    tasks, i = array_2d(control, i, np.int64)
    experts, i = array_1d(control, i, np.int64)
    groups, i = array_1d(control, i, np.int64)
    matmul_float(qtype, qk, block_bytes, row_bytes, buf, x_all, out_all, tasks, experts, groups, one_row_structure,
                 f16_tail, control[0:2])


@njit([(COUNTER, I64) + KQUANT_ARGS], **EXACT)
def matmul_kquant_post(control, entry, kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, mode):
    if not contiguous(buf, q8, xd, bsums, out, tasks, experts, groups):
        matmul_kquant(kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, mode,
                      np.zeros(2, np.int64))
        return
    control[ARGS], control[ARGS + 1], control[ARGS + 2] = kernel, row_bytes, mode
    i = put_array(control, put_array(control, put_array(control, ARGS + 3, xd), out), buf)
    i = put_array(control, put_array(control, put_array(control, i, q8), bsums), tasks)
    i = put_array(control, put_array(control, i, experts), groups)
    publish(control, entry)
    matmul_kquant(kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, mode, control[0:2])
    close_job(control)


@cfunc(ENTRY_SIGNATURE, **CFUNC)
def matmul_kquant_entry(address):
    control = carray(address, (CONTROL_SIZE,))
    kernel, row_bytes, mode = control[ARGS], control[ARGS + 1], control[ARGS + 2]
    xd, i = array_2d(control, ARGS + 3, np.float32)
    out, i = array_2d(control, i, np.float32)
    buf, i = array_1d(control, i, np.uint8)
    q8, i = array_2d(control, i, np.int8)
    bsums, i = array_2d(control, i, np.int32)
    tasks, i = array_2d(control, i, np.int64)
    experts, i = array_1d(control, i, np.int64)
    groups, i = array_1d(control, i, np.int64)
    matmul_kquant(kernel, row_bytes, buf, q8, xd, bsums, out, tasks, experts, groups, mode, control[0:2])


MATMUL_BLOCK32 = Job(matmul_block32, matmul_block32_post, matmul_block32_entry)
MATMUL_KQUANT = Job(matmul_kquant, matmul_kquant_post, matmul_kquant_entry)
MATMUL_FLOAT = Job(matmul_float, matmul_float_post, matmul_float_entry)


# ---- a plan run from numba (the one-token paths of the layers' pieces) ------------------------------

FAMILY_BLOCK32, FAMILY_FLOAT, FAMILY_KQUANT = 0, 1, 2     # MatmulPlan.call_args' first field


@njit([(PLAN, F32_2, BOOL, INDEX, INDEX, COUNTER)], **EXACT)
def plan_rows(plan, x, repeat, experts, groups, counter):
    """A plan's kernel (MatmulPlan.call_args) on x's rows, or with repeat on x's first row taken for each of the
    plan's input rows (rounded once): one-row dots, as PreparedInput and MatmulPlan._run make them for one-row
    inputs and experts. In this thread, or, where counter is the pool's control array (workers.one_call_counter)
    and the plan is worth splitting, shared with the workers on the fast path. Returns the plan's out."""
    family, kind, kernel, qk, block_bytes, row_bytes, buf, xq, xd, xs, xf, tasks, out, entry, split, q8, bsums = plan
    n = 1 if repeat else x.shape[0]
    workers.restart(counter)
    share = split and counter.size > 2
    if family == FAMILY_BLOCK32:
        prepare_rows(kind, x[:n], xq[:n], xd[:n], xs[:n])
        for j in range(n, xq.shape[0]):
            xq[j], xd[j], xs[j] = xq[0], xd[0], xs[0]
        if share:
            matmul_block32_post(counter, entry, kernel, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts,
                                groups)
        else:
            matmul_block32(kernel, block_bytes, row_bytes, buf, xq, xd, xs, out, tasks, experts, groups, counter)
    elif family == FAMILY_KQUANT:       # one row per group: every mode gives it the same kernel (rows_kquant)
        prepare_q8_k_rows(x[:n], xf[:n], q8[:n], xd[:n], bsums[:n])
        for j in range(n, q8.shape[0]):
            q8[j], xd[j], bsums[j] = q8[0], xd[0], bsums[0]
        if share:
            matmul_kquant_post(counter, entry, kernel, np.int64(row_bytes), buf, q8, xd, bsums, out, tasks, experts,
                               groups, ROWS_EXPERT)
        else:
            matmul_kquant(kernel, np.int64(row_bytes), buf, q8, xd, bsums, out, tasks, experts, groups, ROWS_EXPERT,
                          counter)
    else:
        prepare_rows(kind, x[:n], xf[:n], xd, xs)
        for j in range(n, xf.shape[0]):
            xf[j] = xf[0]
        if share:
            matmul_float_post(counter, entry, kernel, qk, block_bytes, row_bytes, buf, xf, out, tasks, experts, groups,
                              True, kernel != F32)
        else:
            matmul_float(kernel, qk, block_bytes, row_bytes, buf, xf, out, tasks, experts, groups, True, kernel != F32,
                         counter)
    return out


@njit(**EXACT)
def one_row(plan, x, counter):
    """The plan (MatmulPlan.call_args for one row, as a FixedArgs) on the one input row x, as a new array:
    MatmulPlan.run's bits in one call, less its Python glue."""
    return plan_rows(plan.args, x, False, FIRST_EXPERT, ONE_ROW_GROUP, counter).copy()


@njit(**EXACT)
def group_rows(plans, where, x, counter, out):
    """A MatrixGroup's plans (MatmulPlan.call_args for one row each, in the group's order) on the one row x, each
    matrix's output copied into out's columns: where[m] = (its plan, first and end column there, first column in
    out) (MatrixGroup.one_token_args)."""
    for j in range(len(plans)):
        res = plan_rows(plans[j], x, False, FIRST_EXPERT, ONE_ROW_GROUP, counter)
        for m in range(where.shape[0]):
            if where[m, 0] == j:
                lo, hi, at = where[m, 1], where[m, 2], where[m, 3]
                out[:, at:at + hi - lo] = res[:, lo:hi]


@njit([(I64, U64, U64, U64, WEIGHTS, types.int64[::1], F32_2)], **EXACT)
def decode_rows(qtype, qk, block_bytes, row_bytes, data, rows, out):
    """out[i] = dequantized row rows[i] (embedding lookups)."""
    for i in range(rows.size):
        decode_row(qtype, data, U(rows[i]) * row_bytes, out[i], qk, block_bytes)


# ---- Python entry points -------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def no_values(n_rows: int) -> np.ndarray:
    """(n_rows, 0): the scales or sums of input rows whose kind has none (no data, so one array serves all)."""
    return np.empty((n_rows, 0), np.float32)


class PreparedInput:
    """Input rows rounded for one activation kind; shared by the matrices that take the same input."""

    def __init__(self, x: np.ndarray | None, kind: int):
        self.kind = kind
        if x is None:
            return
        x = np.ascontiguousarray(x, np.float32)
        n_rows, n = x.shape
        quantized = kind == ACT_Q8_0 or kind == ACT_Q8_1
        self.xd = np.empty((n_rows, n // 32), np.float32) if quantized else no_values(n_rows)
        self.xs = np.empty((n_rows, n // 32), np.float32) if kind == ACT_Q8_1 else no_values(n_rows)
        if kind == ACT_F32:
            self.xq = x
        elif kind == ACT_Q8_K:
            # xq: the float values (float path); q8, xd, xs: the Q8_K integers, scales and 16-value sums
            self.xq, self.q8 = np.empty(x.shape, np.float32), np.empty(x.shape, np.int8)
            self.xd, self.xs = np.empty((n_rows, n // 256), np.float32), np.empty((n_rows, n // 16), np.int32)
            prepare_q8_k_rows(x, self.xq, self.q8, self.xd, self.xs)
        else:
            self.xq = np.empty(x.shape, np.int8 if quantized and HAVE_AVX2 else np.float32)
            prepare_rows(kind, x, self.xq, self.xd, self.xs)

    def take(self, rows: np.ndarray) -> "PreparedInput":
        """The prepared rows `rows` (repeats allowed), as one contiguous input."""
        out = PreparedInput(None, self.kind)
        out.xq, out.xd, out.xs = self.xq[rows], self.xd[rows], self.xs[rows]
        if self.kind == ACT_Q8_K:
            out.q8 = self.q8[rows]
        return out


class Layout:
    """A weight matrix's type and geometry, computed once (kernel arguments are uint64 offsets)."""

    def __init__(self, qtype, n_rows: int, n_cols: int):
        self.qtype = T(qtype)
        self.type_id = int(self.qtype)
        qk, block_bytes = GGML_QUANT_SIZES[self.qtype]
        self.qk, self.block_bytes = U(qk), U(block_bytes)
        self.row_bytes = U(n_cols // qk * block_bytes)
        self.n_rows, self.n_cols = n_rows, n_cols
        self.activation = ACTIVATION.get(self.qtype)
        self.block32 = self.qtype in BLOCK32_TYPES
        self.float_type = self.qtype in (T.F32, T.F16, T.BF16)
        # llama.cpp's tinyBLAS (AVX2) takes a batch only for rows of whole 8-lane steps (k % 8) and a row count
        # that its 4-row tiles cover (m % 4); other matrices (qwen35moe's one-row shared-expert gate) go to
        # vec_dot row by row
        self.tinyblas = n_cols % 8 == 0 and n_rows % 4 == 0
        # the dot's summation order: matrices llama.cpp repacks (ggml_repack_get_optimal_repack_type: Q4_0 and
        # MXFP4 on AVX2 with rows a multiple of 8) use its repacked kernels' order
        repacked = self.qtype in REPACKED_KERNEL and HAVE_AVX2 and n_rows % 8 == 0
        self.kernel_id = REPACKED_KERNEL[self.qtype] if repacked else self.type_id
        self.integer_kquant = self.kernel_id in INTEGER_KQUANT_KERNELS


class MatmulPlan:
    """One kernel call for several matrices of one type and row length that take the same input
    (Q, K and V; gate and up) and lie in one buffer (a whole mapped GGUF file): one fork-join, one
    output array whose column ranges are the matrices' outputs.

    With n_expert > 1 the matrices are stacks of experts (3-D tensors: n_expert matrices of the layout's
    shape, one after the other) and run_experts sends each group of input rows through one expert."""

    def __init__(self, layouts: list, buf: np.ndarray, offsets: list, n_expert: int = 1):
        first = layouts[0]
        if any(l.qtype != first.qtype or l.n_cols != first.n_cols or l.tinyblas != first.tinyblas for l in layouts):
            raise ValueError("a plan's matrices must share type, row length and batch layout")
        self.layout, self.buf = first, buf
        self.matrices, self.columns, column = list(zip(layouts, offsets)), [], 0
        for layout, offset in self.matrices:
            if offset + n_expert * layout.n_rows * int(layout.row_bytes) > buf.size:
                raise ValueError("matrix data lies outside the buffer")
            self.columns.append((column, column + layout.n_rows))
            column += layout.n_rows
        self.n_rows, self._thread_tasks = column, {}
        if first.block32:
            self.job, self.weight_args = MATMUL_BLOCK32, (first.kernel_id, first.block_bytes, first.row_bytes, buf)
        elif first.integer_kquant:
            self.job, self.weight_args = MATMUL_KQUANT, (first.kernel_id, int(first.row_bytes), buf)
        else:
            self.job, self.weight_args = MATMUL_FLOAT, (first.type_id, first.qk, first.block_bytes, first.row_bytes,
                                                        buf)

    def _tasks(self, rows_per_task) -> np.ndarray:
        """(byte offset of the first weight row, rows, output column, bytes per expert) per task; rows_per_task(n_rows)
        of a matrix, a multiple of 8."""
        tasks = []
        for (layout, offset), (column, _) in zip(self.matrices, self.columns):
            step, expert_bytes = rows_per_task(layout.n_rows), layout.n_rows * int(layout.row_bytes)
            for r in range(0, layout.n_rows, step):
                tasks.append((offset + r * int(layout.row_bytes), min(step, layout.n_rows - r), column + r,
                              expert_bytes))
        return np.array(tasks, np.int64)

    def thread_tasks(self, n_threads: int) -> np.ndarray:
        """The tasks split for n_threads (TASKS_PER_THREAD)."""
        if n_threads not in self._thread_tasks:
            def rows_per_task(n_rows):
                # a whole number of tasks per thread, as many as keep them within MAX_ROWS_PER_TASK: cutting the
                # rows to it instead left the last round of claims part-empty (17408 rows on 16 threads: 68 tasks
                # of 256, 12 of the 16 threads idle in the fifth round)
                per_thread = max(TASKS_PER_THREAD, -(-n_rows // (n_threads * MAX_ROWS_PER_TASK)))
                rows = -(-n_rows // (per_thread * n_threads))
                return max(MIN_ROWS_PER_TASK, -(-rows // 8) * 8)
            self._thread_tasks[n_threads] = self._tasks(rows_per_task)
        return self._thread_tasks[n_threads]

    @property
    def one_call(self) -> bool:
        """Whether call_args and plan_rows serve this plan: block32, integer K-quant and F32 / F16 / BF16 weights."""
        return self.layout.block32 or self.layout.integer_kquant or self.layout.float_type

    def call_args(self, n_in: int) -> tuple:
        """For running the plan from numba (plan_rows) on n_in input rows, one row per group: (family, activation
        kind, kernel id, qk, block bytes, row bytes, buf, xq, xd, xs, xf, tasks, out, the fast-path job's entry,
        whether to split it, q8, bsums), the same types for every plan that has one_call, with scratch arrays shaped
        as PreparedInput and _run make them (xq, xd, xs a block32 plan's rounded input; xf a float plan's, or a
        K-quant plan's Q8_K values with q8, xd, bsums its integers), kept by the caller and written anew by every
        call. The tasks and the split are _run's for one-row inputs on the pool's threads."""
        layout = self.layout
        prepared = PreparedInput(np.zeros((n_in, layout.n_cols), np.float32), layout.activation)
        unused = np.empty((n_in, 0), np.float32)
        kernel_id, block_bytes, row_bytes, buf = layout.kernel_id, layout.block_bytes, layout.row_bytes, self.buf
        q8, bsums = np.empty((n_in, 0), np.int8), np.empty((n_in, 0), np.int32)
        if layout.block32:
            family, xq, xd, xs, xf = FAMILY_BLOCK32, prepared.xq, prepared.xd, np.ascontiguousarray(prepared.xs), unused
        elif layout.integer_kquant:
            family, xq, xd, xs, xf = FAMILY_KQUANT, np.empty((n_in, 0), XQ_DTYPE), prepared.xd, unused, prepared.xq
            q8, bsums = prepared.q8, prepared.xs
        else:
            kernel_id = layout.type_id
            family, xq, xd, xs, xf = FAMILY_FLOAT, np.empty((n_in, 0), XQ_DTYPE), unused, unused, prepared.xq
        tasks = self.thread_tasks(workers.pool().n_threads)
        split = len(tasks) * n_in > 1 and n_in * self.n_rows * layout.n_cols >= workers.ONE_CALL_MIN_WORK
        return (np.int64(family), np.int64(layout.activation), np.int64(kernel_id), layout.qk, block_bytes, row_bytes,
                buf, xq, xd, xs, xf, tasks, np.empty((n_in, self.n_rows), np.float32), np.int64(self.job.entry), split,
                q8, bsums)

    def run(self, a: PreparedInput, stepwise: bool = False) -> list:
        """(rows, n_cols) input prepared for the plan's activation kind -> one (rows, n_rows) output
        per matrix (column views of one array). stepwise: every row computed as llama.cpp computes a
        one-row batch (only changes float types)."""
        n_in = a.xq.shape[0]
        # llama.cpp takes tinyBLAS for batches of 2+ rows when the matrix's shape allows, vec_dot otherwise
        one_row = n_in == 1 or stepwise or not self.layout.tinyblas
        groups = ONE_ROW_GROUP if n_in == 1 else np.array([0, n_in], np.int64)
        return self._run(a, FIRST_EXPERT, groups, one_row, rows_mode(stepwise, expert=False))

    def run_experts(self, a: PreparedInput, experts: np.ndarray, groups: np.ndarray) -> list:
        """Input rows groups[g]..groups[g + 1]-1 through expert experts[g]'s matrices, each expert's weights
        read once. Every row is a one-row dot, as in llama.cpp's mul_mat_id."""
        return self._run(a, experts, groups, True, ROWS_EXPERT)

    def _run(self, a: PreparedInput, experts: np.ndarray, groups: np.ndarray, one_row: bool, mode: int) -> list:
        layout, n_in = self.layout, a.xq.shape[0]
        out = np.empty((n_in, self.n_rows), np.float32)
        tasks = self.thread_tasks(workers.pool().n_threads)
        split = (len(tasks) * len(experts), n_in * self.n_rows * layout.n_cols, workers.MATMUL_MIN_WORK)
        if layout.block32:
            workers.run_job(self.job, *split, *self.weight_args, a.xq, a.xd, a.xs, out, tasks, experts, groups)
        elif layout.integer_kquant:
            workers.run_job(self.job, *split, *self.weight_args, a.q8, a.xd, a.xs, out, tasks, experts, groups, mode)
        else:
            workers.run_job(self.job, *split, *self.weight_args, a.xq, out, tasks, experts, groups,
                            layout.float_type and one_row, layout.qtype != T.F32)
        if len(self.columns) == 1:
            return [out]
        return [out[:, lo:hi] for lo, hi in self.columns]


def matmul(layout: Layout, data: np.ndarray, a: PreparedInput, stepwise: bool = False) -> np.ndarray:
    """One matrix stored in data: (rows, n_cols) prepared input -> (rows, n_rows) float32."""
    return MatmulPlan([layout], data, [0]).run(a, stepwise)[0]


def dequantize_rows(layout: Layout, data: np.ndarray, rows: np.ndarray) -> np.ndarray:
    out = np.empty((len(rows), layout.n_cols), np.float32)
    decode_rows(layout.type_id, layout.qk, layout.block_bytes, layout.row_bytes, data,
                np.ascontiguousarray(rows, np.int64), out)
    return out
