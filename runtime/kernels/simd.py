"""Vector kernels emitted as LLVM IR (llvmlite), for the loops numba will not vectorize itself.

numba leaves LLVM's SLP vectorizer off and cannot express the AVX2 lane structure of llama.cpp's dot
products, so the hot inner loops are IR on <8 x float> / <32 x i8> values, callable from numba code
as intrinsics. The float arithmetic is explicit (llvm.fma where ggml fuses), so results do not depend
on how LLVM schedules them.

- dot_row_<type>_1 / _4 / _8 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4): ggml_vec_dot_q*_q8_* of one weight row,
  decoded in registers, with 1, 4 or 8 input rows sharing the decode. Per 32-value block, 8 lanes each
  sum the exact integer products of 4 consecutive values; acc = fma(d_w * d_x, lanes, acc); hsum8;
  plus the m_w * s_x sum for types with a min. On AVX2 CPUs this is ggml's own instruction sequence
  (maddubs, madd, convert; int8 inputs in value order; one vpdpbusd for maddubs + madd where the CPU has VNNI, as
  ggml's VNNI builds, the same exact sums); elsewhere a portable float version ("planes":
  lane l of plane i holds value 4l + i; inputs lane-major) gives the same bits.
- dot_rows8_q4_0_1 / _4, dot_rows8_mxfp4_1 / _4: llama.cpp's repacked 8x8 gemv / gemm (the matrices its CPU_REPACK
  buffer takes): 8 weight rows at a time, one fma per block of each row's exact integer sum.
- stored2_lanes8_1 .. _4: tinyBLAS: lane l accumulates w[k] * x[k], k = l mod 8, with fma; hsum8; two weight rows
  read from their stored f16 / f32 bytes sharing the loads of x (stored4_lanes8_4_ymm: four weight rows, 8-lane
  vectors; stored4_lanes8_4 / _8: four weight rows, 16-lane vectors).
- dot_4x8_main: ggml_vec_dot_f32 / f16: four 8-lane accumulators over steps of 32, reduce4x8 (dot_4x8_stored_1 / _2:
  the weight row read from its stored bytes).
- dot_rows_4x8 / dot_rows_lanes8, exp_blocks8: attention's many dots against one vector and
  ggml_v_expf over a row (softmax).
"""

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ggtools.quants.block32 import KVALUES_MXFP4 as KVALUES_MXFP4_F32

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()
V8F = ir.VectorType(F32, 8)
V16F = ir.VectorType(F32, 16)
V8I = ir.VectorType(I32, 8)
V4B = ir.VectorType(I8, 4)
V16B = ir.VectorType(I8, 16)
V32B = ir.VectorType(I8, 32)


# ---- IR helpers ----------------------------------------------------------------------------------

def _i64(builder, value):
    return builder.zext(value, I64) if value.type.width < 64 else value


def _element_ptr(context, builder, aryty, ary, *indices):
    """Pointer to ary[indices] (no bounds or negative-index handling)."""
    array = context.make_array(aryty)(context, builder, ary)
    return cgutils.get_item_pointer(context, builder, aryty, array, [_i64(builder, i) for i in indices],
                                    wraparound=False)


def _load8(builder, ptr, offset=0):
    if offset:
        ptr = builder.gep(ptr, [ir.Constant(I64, offset)])
    return builder.load(builder.bitcast(ptr, V8F.as_pointer()), align=4)


def _splat(builder, scalar, vtype=V8F):
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), scalar, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), ir.Constant(ir.VectorType(I32, vtype.count),
                                                                                  [0] * vtype.count))


def _llvm(builder, name, ret, args):
    """A call of the LLVM intrinsic `name` (declared in the module on first use)."""
    module = builder.module
    fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _fma(builder, a, b, c):
    """llvm.fma of float32 scalars or vectors (any lane count): one rounding, as ggml's fused multiply-adds."""
    suffix = f"v{a.type.count}f32" if isinstance(a.type, ir.VectorType) else "f32"
    return _llvm(builder, f"llvm.fma.{suffix}", a.type, [a, b, c])


def _input_rows(builder, t, n_rows):
    """The row indices t, t + 1, ..., t + n_rows - 1 (i64) of the input rows a kernel dots at once."""
    return [builder.add(_i64(builder, t), ir.Constant(I64, j)) for j in range(n_rows)]


def _lane(builder, v, i):
    return builder.extract_element(v, ir.Constant(I32, i))


def _hsum8(builder, v):
    """((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))"""
    t = [builder.fadd(_lane(builder, v, i), _lane(builder, v, i + 4)) for i in range(4)]
    return builder.fadd(builder.fadd(t[0], t[2]), builder.fadd(t[1], t[3]))


def _shuffled_sum(builder, a, b, first, second):
    """The lanes `first` of a and b side by side plus their lanes `second` (add or fadd by the element type)."""
    add = builder.add if isinstance(a.type.element, ir.IntType) else builder.fadd
    mask = ir.VectorType(I32, len(first))
    return add(builder.shuffle_vector(a, b, ir.Constant(mask, first)),
               builder.shuffle_vector(a, b, ir.Constant(mask, second)))


def _hsum8_4(builder, accs):
    """_hsum8 of four vectors, the same adds vectorized across them: [t_i = a_i + a_(i+4)] of two vectors per
    add, then t0 + t2 and t1 + t3, then their sum."""
    halves = ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
    t01, t23 = (_shuffled_sum(builder, accs[k], accs[k + 1], *halves) for k in (0, 2))
    u = _shuffled_sum(builder, t01, t23, [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15])
    sums = _shuffled_sum(builder, u, u, [0, 2, 4, 6], [1, 3, 5, 7])
    return [_lane(builder, sums, k) for k in range(4)]


def _reduce4x8(builder, accs):
    a = builder.fadd(builder.fadd(accs[0], accs[2]), builder.fadd(accs[1], accs[3]))
    t = [builder.fadd(_lane(builder, a, i), _lane(builder, a, i + 4)) for i in range(4)]
    return builder.fadd(builder.fadd(t[0], t[1]), builder.fadd(t[2], t[3]))


class _Accumulators:
    """Vector (or scalar) values carried around an IR loop, kept in allocas that LLVM promotes."""

    def __init__(self, builder, n, zero):
        self.builder = builder
        self.slots = [cgutils.alloca_once_value(builder, zero) for _ in range(n)]

    def __getitem__(self, i):
        return self.builder.load(self.slots[i])

    def __setitem__(self, i, value):
        self.builder.store(value, self.slots[i])


def _tuple(context, builder, values, n):
    return context.make_tuple(builder, types.UniTuple(types.float32, n), values)


# ---- dot products --------------------------------------------------------------------------------

def _load_stored8(builder, base, at, is_f16):
    """The 8 weights at element `at` of a row stored from base: f16 (widened: exact) or f32, by a runtime flag
    that is constant in the callers' loops."""
    v8h, v8s = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.IntType(16), 8)
    with builder.if_else(is_f16) as (then, otherwise):
        with then:
            raw = builder.load(builder.bitcast(builder.gep(base, [builder.mul(at, ir.Constant(I64, 2))]),
                                               v8s.as_pointer()), align=1)
            from_f16, f16_block = builder.fpext(builder.bitcast(raw, v8h), V8F), builder.block
        with otherwise:
            ptr = builder.gep(base, [builder.mul(at, ir.Constant(I64, 4))])
            from_f32, f32_block = builder.load(builder.bitcast(ptr, V8F.as_pointer()), align=1), builder.block
    w = builder.phi(V8F)
    w.add_incoming(from_f16, f16_block)
    w.add_incoming(from_f32, f32_block)
    return w


def _row_base(context, builder, data_t, data_a, other_t, other_a, from_other, offset):
    """Pointer to byte `offset` of data, or (from_other) of other: a weight row in the file or a decoded copy,
    chosen in IR so that the caller assigns no array variable in its loop (numba would count references)."""
    a = _element_ptr(context, builder, data_t, data_a, ir.Constant(I64, 0))
    b = _element_ptr(context, builder, other_t, other_a, ir.Constant(I64, 0))
    return builder.gep(builder.select(from_other, b, a), [_i64(builder, offset)])


def _dot_lanes8_rows(n_rows, n_weights=2):
    """tinyBLAS's dot of n_weights weight rows stored from byte `offset` of data (or of `decoded`, when
    from_decoded), row_bytes apart (f16 when is_f16, else f32; read straight from the bytes: widening f16 is exact)
    with input rows t..t+n_rows-1 (length a multiple of 8), every load of x serving them all: lane l sums
    w[i] * x[i] for i = l mod 8 with fma, then hsum8. Results: weight row k . x[t + j] at k * n_rows + j (each such
    pair keeps its own accumulator)."""
    def typer(typingctx, data, decoded, from_decoded, offset, row_bytes, is_f16, x, t):
        def codegen(context, builder, signature, args):
            data_a, dec_a, from_dec, off_v, stride_v, f16_v, x_a, t_v = args
            data_t, dec_t, _, _, _, _, x_t, _ = signature.args
            first = _row_base(context, builder, data_t, data_a, dec_t, dec_a, from_dec, off_v)
            bases = [builder.gep(first, [builder.mul(_i64(builder, stride_v), ir.Constant(I64, k))])
                     for k in range(n_weights)]
            n = _i64(builder, builder.extract_value(context.make_array(x_t)(context, builder, x_a).shape, 1))
            rows = _input_rows(builder, t_v, n_rows)
            acc = _Accumulators(builder, n_weights * n_rows, ir.Constant(V8F, [0.0] * 8))
            with cgutils.for_range(builder, builder.udiv(n, ir.Constant(I64, 8))) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, 8))
                ws = [_load_stored8(builder, base, o, f16_v) for base in bases]
                for j, row in enumerate(rows):
                    xv = _load8(builder, _element_ptr(context, builder, x_t, x_a, row, o))
                    for k, wv in enumerate(ws):
                        acc[k * n_rows + j] = _fma(builder, wv, xv, acc[k * n_rows + j])
            n_out = n_weights * n_rows
            return _tuple(context, builder, [_hsum8(builder, acc[j]) for j in range(n_out)], n_out)

        return types.UniTuple(types.float32, n_weights * n_rows)(data, decoded, from_decoded, offset, row_bytes,
                                                                 is_f16, x, t), codegen
    return intrinsic(typer)


def _sums_4x8(context, builder, load_w, x_t, x_a, t_v, n_v, n_rows):
    """ggml_vec_dot_f32 / f16's main part for input rows t..t+n_rows-1 sharing each load_w(offset, j) (the
    weights' 8 floats at offset + 8 j): four 8-lane accumulators per row over steps of 32, reduce4x8."""
    rows = _input_rows(builder, t_v, n_rows)
    acc = _Accumulators(builder, 4 * n_rows, ir.Constant(V8F, [0.0] * 8))
    with cgutils.for_range(builder, builder.udiv(_i64(builder, n_v), ir.Constant(I64, 32))) as loop:
        o = builder.mul(loop.index, ir.Constant(I64, 32))
        ws = [load_w(o, j) for j in range(4)]
        for r, row in enumerate(rows):
            xp = _element_ptr(context, builder, x_t, x_a, row, o)
            for j in range(4):
                acc[4 * r + j] = _fma(builder, ws[j], _load8(builder, xp, 8 * j), acc[4 * r + j])
    return [_reduce4x8(builder, [acc[4 * r + j] for j in range(4)]) for r in range(n_rows)]


def _dot_4x8(n_rows=None):
    """ggml_vec_dot_f32 / f16 main part: w[:n32] . x[t, :n32] for n32 a multiple of 32. With n_rows, the
    same for rows t..t+n_rows-1 sharing the loads of w (a tuple; each row keeps its own accumulators)."""
    def typer(typingctx, w, x, t, n32):
        def codegen(context, builder, signature, args):
            w_a, x_a, t_v, n_v = args
            w_t, x_t, _, _ = signature.args

            def load_w(o, j):
                return _load8(builder, _element_ptr(context, builder, w_t, w_a, o), 8 * j)

            sums = _sums_4x8(context, builder, load_w, x_t, x_a, t_v, n_v, n_rows or 1)
            return sums[0] if n_rows is None else _tuple(context, builder, sums, n_rows)

        ret = types.float32 if n_rows is None else types.UniTuple(types.float32, n_rows)
        return ret(w, x, t, n32), codegen
    return intrinsic(typer)


def _dot_4x8_stored(n_rows=1):
    """As _dot_4x8, with the weight row read straight from its stored bytes at `offset` of data (or of decoded,
    when from_decoded), f16 (is_f16) or f32: widening f16 is exact, so the bits are those of decoding first;
    a tuple of n_rows results."""
    def typer(typingctx, data, decoded, from_decoded, offset, is_f16, x, t, n32):
        def codegen(context, builder, signature, args):
            data_a, dec_a, from_dec, off_v, f16_v, x_a, t_v, n_v = args
            data_t, dec_t, _, _, _, x_t, _, _ = signature.args
            base = _row_base(context, builder, data_t, data_a, dec_t, dec_a, from_dec, off_v)

            def load_w(o, j):
                return _load_stored8(builder, base, builder.add(o, ir.Constant(I64, 8 * j)), f16_v)

            sums = _sums_4x8(context, builder, load_w, x_t, x_a, t_v, n_v, n_rows)
            return _tuple(context, builder, sums, n_rows)

        return types.UniTuple(types.float32, n_rows)(data, decoded, from_decoded, offset, is_f16, x, t, n32), codegen
    return intrinsic(typer)


def _load_stored16(builder, bases, at, is_f16):
    """8 weights at element `at` of each of two rows stored from bases, side by side in a <16 x float>."""
    v8s = ir.VectorType(ir.IntType(16), 8)
    both = ir.Constant(ir.VectorType(I32, 16), list(range(16)))
    with builder.if_else(is_f16) as (then, otherwise):
        with then:
            raw = [builder.load(builder.bitcast(builder.gep(b, [builder.mul(at, ir.Constant(I64, 2))]),
                                                v8s.as_pointer()), align=1) for b in bases]
            halves = builder.bitcast(builder.shuffle_vector(raw[0], raw[1], both), ir.VectorType(ir.HalfType(), 16))
            from_f16, f16_block = builder.fpext(halves, V16F), builder.block
        with otherwise:
            rows = [builder.load(builder.bitcast(builder.gep(b, [builder.mul(at, ir.Constant(I64, 4))]),
                                                 V8F.as_pointer()), align=1) for b in bases]
            from_f32, f32_block = builder.shuffle_vector(rows[0], rows[1], both), builder.block
    w = builder.phi(V16F)
    w.add_incoming(from_f16, f16_block)
    w.add_incoming(from_f32, f32_block)
    return w


def _dot_lanes8_quad(n_rows):
    """_dot_lanes8_rows for four weight rows stored from byte `offset` of data, row_bytes apart, on 16-lane vectors
    (AVX-512): rows 0 and 1 share one vector (lanes 0-7, 8-15), rows 2 and 3 another, each input row's 8 values
    broadcast to both halves, so every lane keeps the fma chain of tinyBLAS's 8-lane layout. Results: row k . x[t
    + j] at k * n_rows + j."""
    def typer(typingctx, data, offset, row_bytes, is_f16, x, t):
        def codegen(context, builder, signature, args):
            data_a, off_v, stride_v, f16_v, x_a, t_v = args
            data_t, _, _, _, x_t, _ = signature.args
            first = builder.gep(_element_ptr(context, builder, data_t, data_a, ir.Constant(I64, 0)),
                                [_i64(builder, off_v)])
            bases = [builder.gep(first, [builder.mul(_i64(builder, stride_v), ir.Constant(I64, k))]) for k in range(4)]
            n = _i64(builder, builder.extract_value(context.make_array(x_t)(context, builder, x_a).shape, 1))
            rows = _input_rows(builder, t_v, n_rows)
            acc = _Accumulators(builder, 2 * n_rows, ir.Constant(V16F, [0.0] * 16))
            twice = ir.Constant(ir.VectorType(I32, 16), list(range(8)) * 2)
            with cgutils.for_range(builder, builder.udiv(n, ir.Constant(I64, 8))) as loop:
                o = builder.mul(loop.index, ir.Constant(I64, 8))
                ws = [_load_stored16(builder, bases[2 * p:2 * p + 2], o, f16_v) for p in range(2)]
                for j, row in enumerate(rows):
                    x8 = _load8(builder, _element_ptr(context, builder, x_t, x_a, row, o))
                    xv = builder.shuffle_vector(x8, x8, twice)
                    for p, wv in enumerate(ws):
                        acc[p * n_rows + j] = _fma(builder, wv, xv, acc[p * n_rows + j])
            sums = [None] * (4 * n_rows)
            for p in range(2):
                for j in range(n_rows):
                    for half in range(2):
                        lanes = builder.shuffle_vector(acc[p * n_rows + j], acc[p * n_rows + j],
                                                       ir.Constant(V8I, [8 * half + i for i in range(8)]))
                        sums[(2 * p + half) * n_rows + j] = _hsum8(builder, lanes)
            return _tuple(context, builder, sums, 4 * n_rows)

        return types.UniTuple(types.float32, 4 * n_rows)(data, offset, row_bytes, is_f16, x, t), codegen
    return intrinsic(typer)


stored2_lanes8_1, stored2_lanes8_2, stored2_lanes8_3, stored2_lanes8_4 = (_dot_lanes8_rows(n) for n in (1, 2, 3, 4))
stored4_lanes8_4, stored4_lanes8_8 = _dot_lanes8_quad(4), _dot_lanes8_quad(8)
stored4_lanes8_4_ymm = _dot_lanes8_rows(4, n_weights=4)     # 16 accumulators: needs AVX-512's 32 registers
dot_4x8_main = _dot_4x8()
dot_4x8_2 = _dot_4x8(2)
dot_4x8_stored_1, dot_4x8_stored_2 = _dot_4x8_stored(1), _dot_4x8_stored(2)


@intrinsic
def decode_f16_8(typingctx, src, so, dst, n8):
    """dst[:8 * n8] = the f16 values at src[so:] widened to float32, 8 at a time (vcvtph2ps on F16C CPUs;
    widening is exact, so any lowering gives the same bits)."""
    def codegen(context, builder, signature, args):
        src_a, so_v, dst_a, n_v = args
        src_t, _, dst_t, _ = signature.args
        sp = _element_ptr(context, builder, src_t, src_a, so_v)
        dp = _element_ptr(context, builder, dst_t, dst_a, ir.Constant(I64, 0))
        v8h, v8s = ir.VectorType(ir.HalfType(), 8), ir.VectorType(ir.IntType(16), 8)
        with cgutils.for_range(builder, _i64(builder, n_v)) as loop:
            o = builder.mul(loop.index, ir.Constant(I64, 8))
            raw = builder.load(builder.bitcast(builder.gep(sp, [builder.mul(o, ir.Constant(I64, 2))]),
                                               v8s.as_pointer()), align=1)
            wide = builder.fpext(builder.bitcast(raw, v8h), V8F)
            builder.store(wide, builder.bitcast(builder.gep(dp, [o]), V8F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(src, so, dst, n8), codegen


@intrinsic
def round_f16_8(typingctx, src, dst, n8):
    """dst[:8 * n8] = src[:8 * n8] rounded to f16 and back (vcvtps2ph/vcvtph2ps on F16C CPUs): LLVM's fptrunc
    rounds to nearest even, the rounding ggml's FP32_TO_FP16 does, so the bits equal ggmlmath.to_f16's."""
    def codegen(context, builder, signature, args):
        src_a, dst_a, n_v = args
        src_t, dst_t, _ = signature.args
        sp = _element_ptr(context, builder, src_t, src_a, ir.Constant(I64, 0))
        dp = _element_ptr(context, builder, dst_t, dst_a, ir.Constant(I64, 0))
        with cgutils.for_range(builder, _i64(builder, n_v)) as loop:
            o = builder.mul(loop.index, ir.Constant(I64, 8))
            x = _load8(builder, builder.gep(sp, [o]))
            half = builder.fptrunc(x, ir.VectorType(ir.HalfType(), 8))
            builder.store(builder.fpext(half, V8F), builder.bitcast(builder.gep(dp, [o]), V8F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(src, dst, n8), codegen


# ---- fused decode + dot for 32-value block types --------------------------------------------------

class Block32Layout:
    """Where a 32-value block type keeps its fields (bytes from the block start) and how ggml sums its dot.

    scale: "f16" (an fp16 d at byte 0) or "e8m0_half" (MXFP4: a byte e, d = 2^(e - 128), the values doubled).
    lut: the 16 signed values a nibble indexes (MXFP4), else nibbles are values (minus value_offset).
    accumulate: how vec_dot sums block products for the type (the repacked kernels' order is _repacked_dots'):
      "lanes"       acc = fma(d_w * d_x, lanes, acc) over blocks, then hsum8 (ggml_vec_dot_q*_q8_*);
      "pairs"       the same with even and odd blocks in two accumulators, hsum8(acc0 + acc1), and a last odd
                    block added as fma(d_w * d_x, its integer sum, total) (ggml_vec_dot_mxfp4_q8_0, AVX2).
    """

    def __init__(self, block_bytes, qs, nibbles, value_offset=0, m=None, qh=None, scale="f16", lut=None,
                 accumulate="lanes"):
        self.block_bytes, self.qs, self.nibbles = block_bytes, qs, nibbles
        self.value_offset, self.m, self.qh = value_offset, m, qh
        self.scale, self.lut, self.accumulate = scale, lut, accumulate


KVALUES_MXFP4 = tuple(int(v) for v in KVALUES_MXFP4_F32)   # ggml's kvalues_mxfp4: e2m1 values doubled

BLOCK32_LAYOUTS = {
    "q4_0": Block32Layout(18, qs=2, nibbles=True, value_offset=8),
    "q4_1": Block32Layout(20, qs=4, nibbles=True, m=2),
    "q5_0": Block32Layout(22, qs=6, nibbles=True, value_offset=16, qh=2),
    "q5_1": Block32Layout(24, qs=8, nibbles=True, m=2, qh=4),
    "q8_0": Block32Layout(34, qs=2, nibbles=False),
    "mxfp4": Block32Layout(17, qs=1, nibbles=True, scale="e8m0_half", lut=KVALUES_MXFP4, accumulate="pairs"),
}

V16S = ir.VectorType(ir.IntType(16), 16)
_FEATURES = llvm_binding.get_host_cpu_features()
HAVE_AVX2 = bool(_FEATURES.get("avx2"))
HAVE_AVX512 = bool(_FEATURES.get("avx512f"))     # 16-lane float vectors in registers (else LLVM splits them)
HAVE_BYTE_MASKS = bool(_FEATURES.get("avx512bw") and _FEATURES.get("avx512vl"))    # a mask bit per byte lane
# Zen 4 runs a 512-bit operation as two 256-bit halves: there the float batches' four weight rows go on 8-lane
# vectors (F16 16-row batch matmuls 1.4x faster than on 16-lane ones, which broadcast every input load to both halves)
HALF_WIDTH_512 = HAVE_AVX512 and llvm_binding.get_host_cpu_name() == "znver4"
# vpdpbusd on 256-bit vectors (AVX512-VNNI with VL, or AVX-VNNI): u8 . s8 in 4-value lanes, exact in int32
HAVE_VNNI = HAVE_AVX2 and bool(_FEATURES.get("avxvnni") or (_FEATURES.get("avx512vnni") and _FEATURES.get("avx512vl")))


def _load_half(builder, byte_ptr):
    h = builder.load(builder.bitcast(byte_ptr, ir.IntType(16).as_pointer()), align=1)
    return builder.fpext(builder.bitcast(h, ir.HalfType()), F32)


def _load_scale(builder, block_ptr, layout):
    """The block's d: fp16, or E8M0 halved (ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), subnormal for e < 2)."""
    if layout.scale == "f16":
        return _load_half(builder, block_ptr)
    e = builder.zext(builder.load(block_ptr), I32)
    small = builder.shl(ir.Constant(I32, 0x00200000), e)
    normal = builder.shl(builder.sub(e, ir.Constant(I32, 1)), ir.Constant(I32, 23))
    bits = builder.select(builder.icmp_unsigned("<", e, ir.Constant(I32, 2)), small, normal)
    return builder.bitcast(bits, F32)


def _nibble_indices(builder, qs_ptr):
    """<32 x i8>: the 16 bytes' low nibbles (values 0-15), then their high nibbles (values 16-31)."""
    raw = builder.load(builder.bitcast(qs_ptr, V16B.as_pointer()), align=1)
    low = builder.and_(raw, ir.Constant(V16B, [15] * 16))
    high = builder.and_(builder.lshr(raw, ir.Constant(V16B, [4] * 16)), ir.Constant(V16B, [15] * 16))
    return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(I32, 32), list(range(32))))


def _lut_bytes(builder, qs_ptr, lut):
    """The block's values lut[nibble] as <32 x i8> in value order: pshufb on AVX2 (as ggml), selects elsewhere."""
    idx = _nibble_indices(builder, qs_ptr)
    if HAVE_AVX2:
        return _llvm(builder, "llvm.x86.avx2.pshuf.b", V32B, [ir.Constant(V32B, list(lut) * 2), idx])
    values = ir.Constant(V32B, [lut[0]] * 32)
    for k in range(1, 16):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(V32B, [k] * 32))
        values = builder.select(hit, ir.Constant(V32B, [lut[k]] * 32), values)
    return values


def _byte_planes(builder, values):
    """Four lane-major planes of <32 x i8> signed values in value order: lane l of plane i is value 4l + i."""
    return [builder.sitofp(builder.sext(builder.shuffle_vector(
        values, ir.Constant(V32B, ir.Undefined), ir.Constant(V8I, [4 * lane + i for lane in range(8)])), V8I), V8F)
        for i in range(4)]


def _block_planes(builder, block_ptr, layout):
    """The four lane-major planes (<8 x float> integer values) of the block at block_ptr."""
    qs_ptr = builder.gep(block_ptr, [ir.Constant(I64, layout.qs)])
    if layout.lut is not None:
        return _byte_planes(builder, _lut_bytes(builder, qs_ptr, layout.lut))
    if not layout.nibbles:
        return _byte_planes(builder, builder.load(builder.bitcast(qs_ptr, V32B.as_pointer()), align=1))
    raw = builder.load(builder.bitcast(qs_ptr, V16B.as_pointer()), align=1)
    qh = None
    if layout.qh is not None:
        qh_ptr = builder.gep(block_ptr, [ir.Constant(I64, layout.qh)])
        qh = _splat(builder, builder.load(builder.bitcast(qh_ptr, I32.as_pointer()), align=1), V8I)
    planes = []
    for i in range(4):
        picked = builder.shuffle_vector(raw, ir.Constant(V16B, ir.Undefined),
                                        ir.Constant(V8I, [i, i + 4, i + 8, i + 12] * 2))
        value = builder.and_(builder.lshr(builder.zext(picked, V8I), ir.Constant(V8I, [0] * 4 + [4] * 4)),
                             ir.Constant(V8I, [15] * 8))
        if qh is not None:
            bit5 = builder.and_(builder.lshr(qh, ir.Constant(V8I, [4 * lane + i for lane in range(8)])),
                                ir.Constant(V8I, [1] * 8))
            value = builder.or_(value, builder.shl(bit5, ir.Constant(V8I, [4] * 8)))
        if layout.value_offset:
            value = builder.sub(value, ir.Constant(V8I, [layout.value_offset] * 8))
        planes.append(builder.sitofp(value, V8F))
    return planes


def _dot_row_block32_with(decode_block, row_lanes, shifted_lanes=None):
    """ggml's dot of the weight row at data[row_offset] (n_blocks blocks, decoded in registers) with input
    rows t..t+n_rows-1 of (xq, xd, xs): per block, decode_block(builder, block_ptr, layout) once and
    row_lanes(builder, decoded, x_ptr) -> 8 lanes per row (<8 x i32> or <8 x float>: exact integer sums of 4
    products each), summed as layout.accumulate says, plus the m_w * s_x sum for types with a min. With
    weight_rows=8: the 8 rows from data[row_offset] on, in llama.cpp's repacked order (_repacked_dots); results
    weight row k . input row t + j at j * 8 + k.

    With 4 or 8 input rows (weight_rows=1) the kernel also takes the rows' batch forms (xc, xdT: matmul.batch_forms)
    and spends less per input row, with the same bits: every d_w * d_x of a block in one vector multiply (xdT[b]:
    the rows' d_x side by side), and with shifted_lanes (VNNI) a signed type's weights enter once per block as
    unsigned w + 128, each row's lanes starting at xc (-128 times the sum of each 4 of its values): one vpdpbusd
    per row, with no sign fix-up, for the same exact integers."""
    def build(layout, n_rows, weight_rows=1):
        n_results = n_rows * weight_rows
        batched = n_rows > 1 and weight_rows == 1

        def codegen(context, builder, signature, args):
            data_a, row_off, nb_v, xq_a, xd_a, xs_a, t_v = args[:7]
            data_t, _, _, xq_t, xd_t, xs_t, _ = signature.args[:7]
            row_ptr = _element_ptr(context, builder, data_t, data_a, row_off)
            rows = _input_rows(builder, t_v, n_rows)
            nb = _i64(builder, nb_v)
            if weight_rows == 8:
                dots = _repacked_dots(context, builder, layout, (decode_block, row_lanes), row_ptr, nb, rows,
                                      (xq_t, xq_a), (xd_t, xd_a))
                return _tuple(context, builder, dots, n_results)

            def block(b):
                """[(lanes, d_w * d_x) per row] of block b."""
                block_ptr = builder.gep(row_ptr, [builder.mul(b, ir.Constant(I64, layout.block_bytes))])
                d_w = _load_scale(builder, block_ptr, layout)
                decoded = decode_block(builder, block_ptr, layout)
                o = builder.mul(b, ir.Constant(I64, 32))
                if batched:
                    (xc_t, xdT_t), (xc_a, xdT_a) = signature.args[7:], args[7:]
                    rows_d = ir.VectorType(F32, n_rows)
                    d_xs = builder.load(builder.bitcast(_element_ptr(context, builder, xdT_t, xdT_a, b, t_v),
                                                        rows_d.as_pointer()), align=4)
                    ds = builder.fmul(_splat(builder, d_w, rows_d), d_xs)
                shifted = batched and shifted_lanes is not None and decoded[2]
                if shifted:
                    w_u = builder.xor(decoded[0], ir.Constant(V32B, [-128] * 32))
                terms = []
                for j, row in enumerate(rows):
                    xp = _element_ptr(context, builder, xq_t, xq_a, row, o)
                    if shifted:
                        start = builder.bitcast(_element_ptr(context, builder, xc_t, xc_a, row,
                                                             builder.mul(b, ir.Constant(I64, 8))), V8I.as_pointer())
                        lanes = shifted_lanes(builder, w_u, xp, builder.load(start, align=4))
                    else:
                        lanes = row_lanes(builder, decoded, xp)
                    if batched:
                        d = builder.extract_element(ds, ir.Constant(I32, j))
                    else:
                        d = builder.fmul(d_w, builder.load(_element_ptr(context, builder, xd_t, xd_a, row, b)))
                    terms.append((_as_float(builder, lanes), d))
                return terms, block_ptr

            zero8 = ir.Constant(V8F, [0.0] * 8)
            acc = _Accumulators(builder, n_rows, zero8)
            if layout.accumulate == "pairs":
                odd = _Accumulators(builder, n_rows, zero8)
                with cgutils.for_range(builder, builder.udiv(nb, ir.Constant(I64, 2))) as loop:
                    b = builder.mul(loop.index, ir.Constant(I64, 2))
                    for j, (lanes, d) in enumerate(block(b)[0]):
                        acc[j] = _fma(builder, _splat(builder, d), lanes, acc[j])
                    for j, (lanes, d) in enumerate(block(builder.add(b, ir.Constant(I64, 1)))[0]):
                        odd[j] = _fma(builder, _splat(builder, d), lanes, odd[j])
                totals = _Accumulators(builder, n_rows, ir.Constant(F32, 0.0))
                for j in range(n_rows):
                    totals[j] = _hsum8(builder, builder.fadd(acc[j], odd[j]))
                last = builder.sub(nb, ir.Constant(I64, 1))
                with builder.if_then(builder.icmp_unsigned("==", builder.and_(nb, ir.Constant(I64, 1)),
                                                           ir.Constant(I64, 1))):
                    for j, (lanes, d) in enumerate(block(last)[0]):
                        totals[j] = _fma(builder, d, _hsum8(builder, lanes), totals[j])
                return _tuple(context, builder, [totals[j] for j in range(n_rows)], n_rows)

            summs = _Accumulators(builder, n_rows, ir.Constant(F32, 0.0))
            with cgutils.for_range(builder, nb) as loop:
                b = loop.index
                terms, block_ptr = block(b)
                for j, (lanes, d) in enumerate(terms):
                    acc[j] = _fma(builder, _splat(builder, d), lanes, acc[j])
                if layout.m is not None:
                    m_w = _load_half(builder, builder.gep(block_ptr, [ir.Constant(I64, layout.m)]))
                    for j, row in enumerate(rows):
                        s_x = builder.load(_element_ptr(context, builder, xs_t, xs_a, row, b))
                        summs[j] = _fma(builder, m_w, s_x, summs[j])
            results = [builder.fadd(_hsum8(builder, acc[j]), summs[j]) for j in range(n_rows)]
            return _tuple(context, builder, results, n_rows)

        result = types.UniTuple(types.float32, n_results)
        if batched:
            def typer(typingctx, data, row_offset, n_blocks, xq, xd, xs, t, xc, xdT):
                return result(data, row_offset, n_blocks, xq, xd, xs, t, xc, xdT), codegen
        else:
            def typer(typingctx, data, row_offset, n_blocks, xq, xd, xs, t):
                return result(data, row_offset, n_blocks, xq, xd, xs, t), codegen
        return intrinsic(typer)
    return build


def _as_float(builder, lanes):
    return builder.sitofp(lanes, V8F) if lanes.type != V8F else lanes


def _repacked_dots(context, builder, layout, block_dot, row_ptr, n_blocks, rows, xq, xd):
    """llama.cpp's repacked 8x8 gemv / gemm (ggml_gemv/gemm_q4_0_8x8_q8_0, _mxfp4_8x8_q8_0) for the 8 weight rows
    from row_ptr on and the input rows `rows` of xq, xd ((type, array) pairs): per block, lane k gets weight row
    k's exact integer sum (block_dot = (decode_block, row_lanes), whose 8 partial sums _row_sums8 adds up) and
    acc = fma(sums, d_w * d_x, acc), d_w the 8 rows' scales: one fma chain per output, as ggml's kernels keep
    them. Returns the dots, input row major."""
    decode_block, row_lanes = block_dot
    row_bytes = builder.mul(n_blocks, ir.Constant(I64, layout.block_bytes))
    row_ptrs = [builder.gep(row_ptr, [builder.mul(row_bytes, ir.Constant(I64, k))]) for k in range(8)]
    acc = _Accumulators(builder, len(rows), ir.Constant(V8F, [0.0] * 8))
    with cgutils.for_range(builder, n_blocks) as loop:
        b = loop.index
        at = builder.mul(b, ir.Constant(I64, layout.block_bytes))
        block_ptrs = [builder.gep(p, [at]) for p in row_ptrs]
        decoded = [decode_block(builder, p, layout) for p in block_ptrs]
        d_w = ir.Constant(V8F, ir.Undefined)
        for k, p in enumerate(block_ptrs):
            d_w = builder.insert_element(d_w, _load_scale(builder, p, layout), ir.Constant(I32, k))
        o = builder.mul(b, ir.Constant(I64, 32))
        for j, row in enumerate(rows):
            xp = _element_ptr(context, builder, *xq, row, o)
            sums = _as_float(builder, _row_sums8(builder, [row_lanes(builder, w, xp) for w in decoded]))
            d_x = builder.load(_element_ptr(context, builder, *xd, row, b))
            acc[j] = _fma(builder, sums, builder.fmul(d_w, _splat(builder, d_x)), acc[j])
    return [_lane(builder, acc[j], k) for j in range(len(rows)) for k in range(8)]


def _plane_products(builder, planes, xp):
    """Portable: the four lane-major planes times the lane-major float input, summed plane by plane."""
    prods = [builder.fmul(planes[i], _load8(builder, xp, 8 * i)) for i in range(4)]
    return builder.fadd(builder.fadd(prods[0], prods[1]), builder.fadd(prods[2], prods[3]))


_dot_row_block32 = _dot_row_block32_with(_block_planes, _plane_products)


def _row_sums8(builder, vectors):
    """One 8-lane vector whose lane k is the sum of vectors[k]'s lanes (k < 8): pairwise, as phadd does. The
    lanes hold integers (or floats of exact integers), so any order gives the same sums."""
    even, odd = [0, 2, 8, 10, 4, 6, 12, 14], [1, 3, 9, 11, 5, 7, 13, 15]
    level = [_shuffled_sum(builder, vectors[k], vectors[k + 1], even, odd) for k in range(0, 8, 2)]
    level = [_shuffled_sum(builder, level[k], level[k + 1], even, odd) for k in (0, 2)]
    return _shuffled_sum(builder, level[0], level[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])




# ---- the same dot on AVX2's integer instructions ---------------------------------------------------

def _fifth_bits(builder, qh_ptr):
    """<32 x i1>: value k's fifth bit, bit k % 8 of byte k // 8 of the 4 bytes at qh_ptr. With AVX-512 byte masks
    the 32 bits are a mask register as they are (one kmov); else ggml's bytes_from_bits_32 (byte k // 8 spread over
    8 value bytes, then bit k % 8 of each)."""
    if HAVE_BYTE_MASKS:
        qh = builder.load(builder.bitcast(qh_ptr, I32.as_pointer()), align=1)
        return builder.bitcast(qh, ir.VectorType(I1, 32))
    qh = builder.load(builder.bitcast(qh_ptr, V4B.as_pointer()), align=1)
    spread = builder.shuffle_vector(qh, ir.Constant(V4B, ir.Undefined),
                                    ir.Constant(ir.VectorType(I32, 32), [k // 8 for k in range(32)]))
    return builder.icmp_unsigned("!=", builder.and_(spread, ir.Constant(V32B, [1 << (k % 8) for k in range(32)])),
                                 ir.Constant(V32B, [0] * 32))


def _block_bytes(builder, block_ptr, layout):
    """The block's 32 values as <32 x i8> in value order, and whether they are signed."""
    qs_ptr = builder.gep(block_ptr, [ir.Constant(I64, layout.qs)])
    if layout.lut is not None:
        return _lut_bytes(builder, qs_ptr, layout.lut), True
    if not layout.nibbles:
        return builder.load(builder.bitcast(qs_ptr, V32B.as_pointer()), align=1), True
    values = _nibble_indices(builder, qs_ptr)
    if layout.qh is not None:
        bit = _fifth_bits(builder, builder.gep(block_ptr, [ir.Constant(I64, layout.qh)]))
        if layout.value_offset == 16:
            # Q5_0 as ggml: (nibble | bit << 4) - 16 is the nibble where the bit is set, nibble | 0xF0 where not
            return builder.or_(values, builder.select(bit, ir.Constant(V32B, [0] * 32),
                                                      ir.Constant(V32B, [-16] * 32))), True
        values = builder.or_(values, builder.select(bit, ir.Constant(V32B, [16] * 32), ir.Constant(V32B, [0] * 32)))
    if layout.value_offset:
        values = builder.sub(values, ir.Constant(V32B, [layout.value_offset] * 32))
    return values, layout.value_offset != 0


def _avx2_weights(builder, block_ptr, layout):
    w, signed = _block_bytes(builder, block_ptr, layout)
    return w, (_llvm(builder, "llvm.x86.avx2.psign.b", V32B, [w, w]) if signed else w), signed


def _unsigned_pairs(builder, decoded, xp):
    """(|w|, x with w's signs) as <32 x i8>: ggml's operands for an unsigned . signed byte product."""
    w, w_abs, signed = decoded
    x = builder.load(builder.bitcast(xp, V32B.as_pointer()), align=1)
    if signed:
        x = _llvm(builder, "llvm.x86.avx2.psign.b", V32B, [x, w])
    return w_abs, x


def _maddubs_lane_sums(builder, decoded, xp):
    """ggml's own sequence on int8 inputs in value order (its AVX2 builds): maddubs (|w| against sign-adjusted x
    for signed types), madd with ones: <8 x i32>."""
    pairs = _llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", V16S, list(_unsigned_pairs(builder, decoded, xp)))
    return _llvm(builder, "llvm.x86.avx2.pmadd.wd", V8I, [pairs, ir.Constant(V16S, [1] * 16)])


def _vnni_lane_sums(builder, decoded, xp):
    """The same lanes in one vpdpbusd, as ggml's AVX512-VNNI builds sum them: maddubs' 16-bit pair sums cannot
    saturate on these operands (|w| <= 128, |x| <= 127 since Q8 activations never reach -128: at most 2 * 128 *
    127 = 32512), so both give the exact sums."""
    w_abs, x = _unsigned_pairs(builder, decoded, xp)
    return _llvm(builder, "llvm.x86.avx512.vpdpbusd.256", V8I,
                [ir.Constant(V8I, [0] * 8), builder.bitcast(w_abs, V8I), builder.bitcast(x, V8I)])


def _shifted_vnni_lane_sums(builder, w_u, xp, start):
    """start + the lanes of unsigned w_u (w + 128) . x in one vpdpbusd: with start = -128 * x's 4-value sums, the
    lanes of w . x (exact: |start + sum| < 2^31)."""
    x = builder.load(builder.bitcast(xp, V32B.as_pointer()), align=1)
    return _llvm(builder, "llvm.x86.avx512.vpdpbusd.256", V8I,
                [start, builder.bitcast(w_u, V8I), builder.bitcast(x, V8I)])


_dot_row_block32_avx2 = _dot_row_block32_with(_avx2_weights, _vnni_lane_sums if HAVE_VNNI else _maddubs_lane_sums,
                                              _shifted_vnni_lane_sums if HAVE_VNNI else None)
_dot_row_block32_maddubs = _dot_row_block32_with(_avx2_weights, _maddubs_lane_sums)


# ---- K-quant integer lanes (kquant_dot.py) ---------------------------------------------------------

V32S, V32I = ir.VectorType(ir.IntType(16), 32), ir.VectorType(I32, 32)


def _bytes32(builder, ptr):
    return builder.load(builder.bitcast(ptr, V32B.as_pointer()), align=1)


def _lanes_of_4(builder, products):
    """<32 x i16> products -> <8 x i32>: lane l the sum of products 4l..4l+3 (exact integers)."""
    wide = builder.sext(products, V32I)
    picks = [builder.shuffle_vector(wide, ir.Constant(V32I, ir.Undefined),
                                    ir.Constant(V8I, [4 * lane + k for lane in range(8)])) for k in range(4)]
    return builder.add(builder.add(picks[0], picks[1]), builder.add(picks[2], picks[3]))


def _sum_lanes(builder, v):
    """The sum of an <8 x i32>'s lanes (exact integers: any order)."""
    return _lane(builder, _row_sums8(builder, [v] * 8), 0)


def _lane_scales(builder, scale_low, scale_high):
    """The scales _scaled_lanes applies (i32 scale_low for lanes 0-3, scale_high for lanes 4-7), made once for the
    input rows that share a weight chunk: 16 x i16 for madd on AVX2, else 8 x i32."""
    if HAVE_AVX2:
        v8s = ir.VectorType(ir.IntType(16), 8)
        low, high = (_splat(builder, builder.trunc(s, ir.IntType(16)), v8s) for s in (scale_low, scale_high))
        return builder.shuffle_vector(low, high, ir.Constant(ir.VectorType(I32, 16), list(range(16))))
    return builder.shuffle_vector(_splat(builder, scale_low, V8I), _splat(builder, scale_high, V8I),
                                  ir.Constant(V8I, [0, 1, 2, 3, 12, 13, 14, 15]))


def _scaled_lanes(builder, values, x, scales):
    """<8 x i32>: lane l = scale * (unsigned values[4l..4l+3] . signed x[4l..4l+3]), <32 x i8> each, with the
    scales of _lane_scales. On AVX2 ggml's maddubs + madd."""
    if HAVE_AVX2:
        pairs = _llvm(builder, "llvm.x86.avx2.pmadd.ub.sw", V16S, [values, x])
        return _llvm(builder, "llvm.x86.avx2.pmadd.wd", V8I, [pairs, scales])
    return builder.mul(scales, _lanes_of_4(builder, builder.mul(builder.zext(values, V32S), builder.sext(x, V32S))))


def _store_lanes(builder, lanes, ptr):
    builder.store(lanes, builder.bitcast(ptr, V8I.as_pointer()), align=4)


def _store_4(builder, v8, half, ptr):
    """Store lanes 4 * half .. 4 * half + 3 of an <8 x i32> at ptr."""
    v4 = builder.shuffle_vector(v8, v8, ir.Constant(ir.VectorType(I32, 4), [4 * half + k for k in range(4)]))
    builder.store(v4, builder.bitcast(ptr, ir.VectorType(I32, 4).as_pointer()), align=4)


def _pair_sums(builder, v):
    """An integer vector of 2n lanes -> n lanes: lane l = v[2l] + v[2l + 1]."""
    n = v.type.count // 2
    even, odd = (builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), [2 * l + k for l in range(n)]))
                 for k in (0, 1))
    return builder.add(even, odd)


def _q4_k_chunk_lanes(n_rows):
    """One Q4_K super-block (bytes from bo) against the Q8_K values q8[t + r, xo:xo + 256] of input rows r < n_rows
    (their 16-value sums bsums[t + r, go:go + 16]), the weight decoded once for them all; exact integers (ggml's
    maddubs / madd lanes; the super-block's 8 scales and mins: int32 scales[so:so + 8], mins[so:so + 8]): with
    lanes_c[l] = scale 2c * (values 4l..4l+3 of sub-block 2c . q8) + scale 2c + 1 * (the same of sub-block 2c + 1)
    for the 64-value chunks c < 4, out[r, l] = the sum of lanes_c[l] over c (l < 8), out[r, 8 + c] = the sum of
    lanes_c's lanes and out[r, 12 + c] = min 2c * (the q8 sum of sub-block 2c) + min 2c + 1 * (that of 2c + 1)."""
    def typer(typingctx, buf, bo, q8, t, xo, scales, mins, so, bsums, go, out):
        def codegen(context, builder, signature, args):
            buf_a, bo_v, q8_a, t_v, xo_v, sc_a, mn_a, so_v, bs_a, go_v, out_a = args
            buf_t, _, q8_t, _, _, sc_t, mn_t, _, bs_t, _, out_t = signature.args
            scales_at = _element_ptr(context, builder, sc_t, sc_a, so_v)
            block = _element_ptr(context, builder, buf_t, buf_a, bo_v)
            rows = _input_rows(builder, t_v, n_rows)
            xps = [_element_ptr(context, builder, q8_t, q8_a, row, xo_v) for row in rows]
            chunks = [[None] * 4 for _ in range(n_rows)]
            for c in range(4):
                raw = _bytes32(builder, builder.gep(block, [ir.Constant(I64, 16 + 32 * c)]))
                low = builder.and_(raw, ir.Constant(V32B, [15] * 32))
                high = builder.lshr(raw, ir.Constant(V32B, [4] * 32))
                s_low, s_high = (builder.load(builder.gep(scales_at, [ir.Constant(I64, 2 * c + k)])) for k in (0, 1))
                s_low, s_high = _lane_scales(builder, s_low, s_low), _lane_scales(builder, s_high, s_high)
                for r, xp in enumerate(xps):
                    x_low = _bytes32(builder, builder.gep(xp, [ir.Constant(I64, 64 * c)]))
                    x_high = _bytes32(builder, builder.gep(xp, [ir.Constant(I64, 64 * c + 32)]))
                    chunks[r][c] = builder.add(_scaled_lanes(builder, low, x_low, s_low),
                                               _scaled_lanes(builder, high, x_high, s_high))
            mins = builder.load(builder.bitcast(_element_ptr(context, builder, mn_t, mn_a, so_v), V8I.as_pointer()),
                                align=4)

            def out_at(r, k):
                return _element_ptr(context, builder, out_t, out_a, ir.Constant(I64, r), ir.Constant(I64, k))

            for r, row in enumerate(rows):
                c = chunks[r]
                _store_lanes(builder, builder.add(builder.add(c[0], c[1]), builder.add(c[2], c[3])), out_at(r, 0))
                bs = builder.bitcast(_element_ptr(context, builder, bs_t, bs_a, row, go_v),
                                     ir.VectorType(I32, 16).as_pointer())
                by_sub_block = _pair_sums(builder, builder.load(bs, align=4))
                imin = _pair_sums(builder, builder.mul(by_sub_block, mins))
                builder.store(imin, builder.bitcast(out_at(r, 12), imin.type.as_pointer()), align=4)
            for r in range(0, n_rows, 2):   # the chunk sums of two rows per reduction
                pair = chunks[r] + chunks[min(r + 1, n_rows - 1)]
                sums = _row_sums8(builder, pair)
                _store_4(builder, sums, 0, out_at(r, 8))
                if r + 1 < n_rows:
                    _store_4(builder, sums, 1, out_at(r + 1, 8))
            return context.get_dummy_value()

        return types.void(buf, bo, q8, t, xo, scales, mins, so, bsums, go, out), codegen
    return intrinsic(typer)


def _q6_k_lanes(n_rows):
    """One Q6_K super-block (bytes from bo) against q8[t + r, xo:xo + 256] of input rows r < n_rows (their 16-value
    sums bsums[t + r, go:go + 16], int32), the weight decoded once for them all; exact integers: out[r, l] = ggml's
    lane l, the sum over the 32-value chunks of scale * (unsigned values 4l..4l+3 . q8) (the scale of the chunk's
    first or second 16 values) less 32 * (bsums[2l] * scale_2l + bsums[2l + 1] * scale_2l+1); out[r, 8] = the sum
    of the lanes."""
    def typer(typingctx, buf, bo, q8, t, xo, bsums, go, out):
        def codegen(context, builder, signature, args):
            buf_a, bo_v, q8_a, t_v, xo_v, bs_a, go_v, out_a = args
            buf_t, _, q8_t, _, _, bs_t, _, out_t = signature.args
            block = _element_ptr(context, builder, buf_t, buf_a, bo_v)
            rows = _input_rows(builder, t_v, n_rows)
            xps = [_element_ptr(context, builder, q8_t, q8_a, row, xo_v) for row in rows]
            acc = [ir.Constant(V8I, [0] * 8)] * n_rows
            for j in range(2):
                qh = _bytes32(builder, builder.gep(block, [ir.Constant(I64, 128 + 32 * j)]))
                for c in range(4):
                    ql = _bytes32(builder, builder.gep(block, [ir.Constant(I64, 64 * j + 32 * (c & 1))]))
                    low = builder.and_(builder.lshr(ql, ir.Constant(V32B, [4 * (c >> 1)] * 32)),
                                       ir.Constant(V32B, [15] * 32))
                    high = builder.and_(builder.lshr(qh, ir.Constant(V32B, [2 * c] * 32)), ir.Constant(V32B, [3] * 32))
                    q = builder.or_(low, builder.shl(high, ir.Constant(V32B, [4] * 32)))
                    scale = [builder.sext(builder.load(builder.gep(block, [ir.Constant(I64, 192 + 8 * j + 2 * c + k)])),
                                          I32) for k in (0, 1)]
                    scales = _lane_scales(builder, scale[0], scale[1])
                    for r, xp in enumerate(xps):
                        x = _bytes32(builder, builder.gep(xp, [ir.Constant(I64, 128 * j + 32 * c)]))
                        acc[r] = builder.add(acc[r], _scaled_lanes(builder, q, x, scales))
            scales = builder.sext(builder.load(builder.bitcast(builder.gep(block, [ir.Constant(I64, 192)]),
                                                               V16B.as_pointer()), align=1), ir.VectorType(I32, 16))
            for r, row in enumerate(rows):
                bs = builder.bitcast(_element_ptr(context, builder, bs_t, bs_a, row, go_v),
                                     ir.VectorType(I32, 16).as_pointer())
                bias = _pair_sums(builder, builder.mul(builder.load(bs, align=4), scales))
                lanes = builder.sub(acc[r], builder.shl(bias, ir.Constant(V8I, [5] * 8)))
                _store_lanes(builder, lanes, _element_ptr(context, builder, out_t, out_a, ir.Constant(I64, r),
                                                          ir.Constant(I64, 0)))
                builder.store(_sum_lanes(builder, lanes), _element_ptr(context, builder, out_t, out_a,
                                                                       ir.Constant(I64, r), ir.Constant(I64, 8)))
            return context.get_dummy_value()

        return types.void(buf, bo, q8, t, xo, bsums, go, out), codegen
    return intrinsic(typer)


@intrinsic
def fma_lanes8(typingctx, acc, r, d, lanes):
    """acc[r, :8] = fma(d, float(lanes[r, :8]), acc[r, :8]) (float32 acc, int32 lanes): vec_dot's 8 accumulators over
    one super-block, one vector fma (each lane's fma as the scalar one rounds it)."""
    def codegen(context, builder, signature, args):
        acc_a, r_v, d_v, lanes_a = args
        acc_t, _, _, lanes_t = signature.args
        at = builder.bitcast(_element_ptr(context, builder, acc_t, acc_a, r_v, ir.Constant(I64, 0)), V8F.as_pointer())
        lp = builder.bitcast(_element_ptr(context, builder, lanes_t, lanes_a, r_v, ir.Constant(I64, 0)),
                             V8I.as_pointer())
        summed = _fma(builder, _splat(builder, d_v), builder.sitofp(builder.load(lp, align=4), V8F),
                       builder.load(at, align=4))
        builder.store(summed, at, align=4)
        return context.get_dummy_value()

    return types.void(acc, r, d, lanes), codegen


# rows of Q8_K input per call: 8 or 4 sharing each decoded weight chunk (more spill registers on AVX2), or one
q4_k_chunk_lanes_1, q4_k_chunk_lanes_4, q4_k_chunk_lanes_8 = (_q4_k_chunk_lanes(n) for n in (1, 4, 8))
q6_k_lanes_1, q6_k_lanes_4, q6_k_lanes_8 = (_q6_k_lanes(n) for n in (1, 4, 8))


# ---- attention: many dots against one vector, ggml_v_expf ------------------------------------------

def _dot_rows(one_row_structure):
    """out[r] = w . x[r] for r < n_rows, in ggml_vec_dot's 4x8 layout (len(w) a multiple of 32) or
    tinyBLAS's 8 lanes (a multiple of 8): all the scores of one query, or all the outputs of one
    probability row."""
    def typer(typingctx, w, x, n_rows, out):
        def codegen(context, builder, signature, args):
            w_a, x_a, n_v, out_a = args
            w_t, x_t, _, out_t = signature.args
            n = _i64(builder, context.make_array(w_t)(context, builder, w_a).nitems)
            wp = _element_ptr(context, builder, w_t, w_a, ir.Constant(I64, 0))
            n_rows = _i64(builder, n_v)
            # tinyBLAS's one-accumulator rows go four at a time, sharing the loads of w (each keeps its own chain)
            group = 1 if one_row_structure else 4
            n_groups = builder.udiv(n_rows, ir.Constant(I64, group))

            def dot_rows(first, count):
                step = 32 if one_row_structure else 8
                xps = [_element_ptr(context, builder, x_t, x_a, builder.add(first, ir.Constant(I64, k)),
                                    ir.Constant(I64, 0)) for k in range(count)]
                acc = _Accumulators(builder, 4 * count if one_row_structure else count, ir.Constant(V8F, [0.0] * 8))
                with cgutils.for_range(builder, builder.udiv(n, ir.Constant(I64, step))) as loop:
                    o = builder.mul(loop.index, ir.Constant(I64, step))
                    for j in range(step // 8):
                        ws = _load8(builder, builder.gep(wp, [o]), 8 * j)
                        for k, xp in enumerate(xps):
                            a = k * (step // 8) + j
                            acc[a] = _fma(builder, ws, _load8(builder, builder.gep(xp, [o]), 8 * j), acc[a])
                if one_row_structure:
                    totals = [_reduce4x8(builder, [acc[4 * k + j] for j in range(4)]) for k in range(count)]
                elif count == 4:
                    totals = _hsum8_4(builder, [acc[k] for k in range(4)])
                else:
                    totals = [_hsum8(builder, acc[k]) for k in range(count)]
                for k, total in enumerate(totals):
                    row = builder.add(first, ir.Constant(I64, k))
                    builder.store(total, _element_ptr(context, builder, out_t, out_a, row))

            with cgutils.for_range(builder, n_groups) as groups:
                dot_rows(builder.mul(groups.index, ir.Constant(I64, group)), group)
            grouped = builder.mul(n_groups, ir.Constant(I64, group))
            with cgutils.for_range(builder, builder.sub(n_rows, grouped)) as rest:
                dot_rows(builder.add(grouped, rest.index), 1)
            return context.get_dummy_value()

        return types.void(w, x, n_rows, out), codegen
    return intrinsic(typer)


def _v8(values):
    return ir.Constant(V8F, [float(v) for v in values])


def _v_expf(builder, x):
    """ggml_v_expf (AVX2 + FMA) on 8 lanes; where a lane needs the slow path it is selected per lane, as the blend
    does."""
    module = builder.module
    fabs = module.globals.get("llvm.fabs.v8f32") or ir.Function(module, ir.FunctionType(V8F, [V8F]), "llvm.fabs.v8f32")
    shift = _v8([2.0 ** 23 * 1.5] * 8)
    z = _fma(builder, x, _v8([float.fromhex("0x1.715476p+0")] * 8), shift)
    n = builder.fsub(z, shift)
    neg_n = builder.fsub(_v8([-0.0] * 8), n)
    b = _fma(builder, neg_n, _v8([float.fromhex("0x1.7f7d1cp-20")] * 8),
              _fma(builder, neg_n, _v8([float.fromhex("0x1.62e4p-1")] * 8), x))
    e = builder.shl(builder.bitcast(z, V8I), ir.Constant(V8I, [23] * 8))
    k = builder.bitcast(builder.add(e, ir.Constant(V8I, [0x3F800000] * 8)), V8F)
    abs_n = builder.call(fabs, [n])
    c = builder.fcmp_ordered(">", abs_n, _v8([126.0] * 8))
    u = builder.fmul(b, b)
    p = [_v8([float.fromhex(h)] * 8) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                              "0x1.ffffecp-1")]
    j = _fma(builder, _fma(builder, _fma(builder, p[0], b, p[1]), u, _fma(builder, p[2], b, p[3])), u,
              builder.fmul(p[4], b))
    fast = _fma(builder, k, j, k)
    # as ggml, the slow path only when a lane needs it: its products of scales underflow for the other lanes, and a
    # denormal result costs a microcode assist (measured: exp of values in -10..10 at 1.9 ns a value, against 0.3)
    any_slow = builder.icmp_unsigned("!=", builder.bitcast(c, ir.IntType(8)), ir.Constant(ir.IntType(8), 0))
    fast_block = builder.block
    with builder.if_then(any_slow, likely=False):
        g = builder.select(builder.fcmp_ordered("<=", n, _v8([0.0] * 8)),
                           ir.Constant(V8I, [0x82000000 - (1 << 32)] * 8), ir.Constant(V8I, [0] * 8))
        s1 = builder.bitcast(builder.add(g, ir.Constant(V8I, [0x7F000000] * 8)), V8F)
        s2 = builder.bitcast(builder.sub(e, g), V8F)
        d = builder.fcmp_ordered(">", abs_n, _v8([192.0] * 8))
        near = builder.select(c, builder.fmul(_fma(builder, s2, j, s2), s1), fast)
        slow, slow_block = builder.select(d, builder.fmul(s1, s1), near), builder.block
    result = builder.phi(V8F)
    result.add_incoming(slow, slow_block)
    result.add_incoming(fast, fast_block)
    return result


def _silu_8(times_y):
    """ggml_vec_silu_f32 (ggml_vec_swiglu_f32 with times_y) on x[:8 * n8] of a row (unit stride): out = x / (1 +
    ggml_v_expf(0 - x)) in 8-value chunks, then (times_y) times y, rounded after the silu as ggml does."""
    def codegen(context, builder, signature, args):
        rows = list(zip(signature.args[:-1], args[:-1]))   # x, (y,) out
        xp, *yp, op = (_element_ptr(context, builder, t, a, ir.Constant(I64, 0)) for t, a in rows)
        with cgutils.for_range(builder, _i64(builder, args[-1])) as loop:
            o = builder.mul(loop.index, ir.Constant(I64, 8))
            x = _load8(builder, builder.gep(xp, [o]))
            e = _v_expf(builder, builder.fsub(_v8([0.0] * 8), x))
            s = builder.fdiv(x, builder.fadd(_v8([1.0] * 8), e))
            if times_y:
                s = builder.fmul(s, _load8(builder, builder.gep(yp[0], [o])))
            builder.store(s, builder.bitcast(builder.gep(op, [o]), V8F.as_pointer()), align=4)
        return context.get_dummy_value()

    if times_y:
        def typer(typingctx, x, y, out, n8):
            return types.void(x, y, out, n8), codegen
    else:
        def typer(typingctx, x, out, n8):
            return types.void(x, out, n8), codegen
    return intrinsic(typer)


silu_8, swiglu_8 = _silu_8(False), _silu_8(True)


@intrinsic
def exp_blocks8(typingctx, w, w_max, out):
    """out = ggml_v_expf(w - w_max) in blocks of 8 (len(w) a multiple of 8); returns the float64 sum
    of each block's hsum8, as ggml_vec_soft_max_f32 accumulates it."""
    def codegen(context, builder, signature, args):
        w_a, m_v, out_a = args
        w_t, _, out_t = signature.args
        n = _i64(builder, context.make_array(w_t)(context, builder, w_a).nitems)
        wp = _element_ptr(context, builder, w_t, w_a, ir.Constant(I64, 0))
        op = _element_ptr(context, builder, out_t, out_a, ir.Constant(I64, 0))
        m = _splat(builder, m_v)
        total = cgutils.alloca_once_value(builder, ir.Constant(ir.DoubleType(), 0.0))
        with cgutils.for_range(builder, builder.udiv(n, ir.Constant(I64, 8))) as loop:
            o = builder.mul(loop.index, ir.Constant(I64, 8))
            e = _v_expf(builder, builder.fsub(_load8(builder, builder.gep(wp, [o])), m))
            builder.store(e, builder.bitcast(builder.gep(op, [o]), V8F.as_pointer()), align=4)
            block = builder.fpext(_hsum8(builder, e), ir.DoubleType())
            builder.store(builder.fadd(builder.load(total), block), total)
        return builder.load(total)

    return types.float64(w, w_max, out), codegen


dot_rows_4x8 = _dot_rows(True)
dot_rows_lanes8 = _dot_rows(False)

_DOT_ROW = _dot_row_block32_avx2 if HAVE_AVX2 else _dot_row_block32
dot_row_q4_0_1, dot_row_q4_0_4 = _DOT_ROW(BLOCK32_LAYOUTS["q4_0"], 1), _DOT_ROW(BLOCK32_LAYOUTS["q4_0"], 4)
dot_row_q4_1_1, dot_row_q4_1_4 = _DOT_ROW(BLOCK32_LAYOUTS["q4_1"], 1), _DOT_ROW(BLOCK32_LAYOUTS["q4_1"], 4)
dot_row_q5_0_1, dot_row_q5_0_4 = _DOT_ROW(BLOCK32_LAYOUTS["q5_0"], 1), _DOT_ROW(BLOCK32_LAYOUTS["q5_0"], 4)
dot_row_q5_1_1, dot_row_q5_1_4 = _DOT_ROW(BLOCK32_LAYOUTS["q5_1"], 1), _DOT_ROW(BLOCK32_LAYOUTS["q5_1"], 4)
dot_row_q8_0_1, dot_row_q8_0_4 = _DOT_ROW(BLOCK32_LAYOUTS["q8_0"], 1), _DOT_ROW(BLOCK32_LAYOUTS["q8_0"], 4)
dot_row_mxfp4_1, dot_row_mxfp4_4 = _DOT_ROW(BLOCK32_LAYOUTS["mxfp4"], 1), _DOT_ROW(BLOCK32_LAYOUTS["mxfp4"], 4)
dot_row_q4_0_8, dot_row_q4_1_8, dot_row_q5_0_8, dot_row_q5_1_8, dot_row_q8_0_8, dot_row_mxfp4_8 = (
    _DOT_ROW(BLOCK32_LAYOUTS[name], 8) for name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4"))
dot_rows8_q4_0_1, dot_rows8_q4_0_4 = (_DOT_ROW(BLOCK32_LAYOUTS["q4_0"], n, weight_rows=8) for n in (1, 4))
dot_rows8_mxfp4_1, dot_rows8_mxfp4_4 = (_DOT_ROW(BLOCK32_LAYOUTS["mxfp4"], n, weight_rows=8) for n in (1, 4))


# ---- input rows rounded for the integer dots ---------------------------------------------------------

def _reduce(builder, name, v):
    """llvm.vector.reduce.<name> of an <8 x i32> (umax, add, or on i1 lanes...)."""
    return _llvm(builder, f"llvm.vector.reduce.{name}.v{v.type.count}{_suffix(v.type.element)}", v.type.element, [v])


def _suffix(element):
    return "f32" if element == F32 else f"i{element.width}"


def _block_vectors(context, builder, x_t, x_a, o, n):
    """x[o:o + 8n] as n <8 x float> vectors."""
    xp = _element_ptr(context, builder, x_t, x_a, o)
    return [_load8(builder, xp, 8 * i) for i in range(n)]


def _abs_bits(builder, v):
    """|v| as <8 x i32> bits: ordered as |v| is for every non-NaN lane (a NaN's bits exceed inf's)."""
    return builder.and_(builder.bitcast(v, V8I), ir.Constant(V8I, [0x7FFFFFFF] * 8))


def _fold(builder, combine, vectors):
    while len(vectors) > 1:
        vectors = [combine(vectors[k], vectors[k + 1]) for k in range(0, len(vectors), 2)]
    return vectors[0]


def _umax(builder, a, b):
    return builder.select(builder.icmp_unsigned(">", a, b), a, b)


def _cvtps2dq(builder, v):
    """cvtps2dq: round to nearest even, INT_MIN for NaN and out-of-range lanes (the same in portable IR where the
    CPU has no AVX2, which only compiles this: the callers take the AVX2 path alone)."""
    if HAVE_AVX2:
        return _llvm(builder, "llvm.x86.avx.cvt.ps2dq.256", V8I, [v])
    r = _llvm(builder, "llvm.rint.v8f32", V8F, [v])
    fits = builder.fcmp_ordered("<", _llvm(builder, "llvm.fabs.v8f32", V8F, [r]), _v8([2.0 ** 31] * 8))
    return builder.select(fits, builder.fptosi(builder.select(fits, r, _v8([0.0] * 8)), V8I),
                          ir.Constant(V8I, [-2 ** 31] * 8))


@intrinsic
def q8_0_block(typingctx, x, o, xq):
    """quantize_row_q8_0 / q8_1's AVX2 block (ggml's instruction sequence): x[o:o + 32] -> xq[o:o + 32] (int8, value
    order) = cvtps2dq(x * id) packed with signed saturation (cvtps2dq's INT_MIN for an inf or NaN product gives
    -128), id = 127 / amax (0 when amax is 0), amax taken on the bits (a NaN makes it NaN). Returns the block's
    scale d = amax / 127 and Q8_1's sum d * s (s the int32 sum of the cvtps2dq values, wrapping as ggml's), each
    rounded to f16 (fptrunc: round to nearest even, as ggml's FP32_TO_FP16)."""
    def codegen(context, builder, signature, args):
        x_a, o_v, xq_a = args
        x_t, _, xq_t = signature.args
        v = _block_vectors(context, builder, x_t, x_a, o_v, 4)
        amax = builder.bitcast(_reduce(builder, "umax", _fold(builder, lambda a, b: _umax(builder, a, b),
                                                               [_abs_bits(builder, u) for u in v])), F32)
        d = builder.fdiv(amax, ir.Constant(F32, 127.0))
        inv = builder.select(builder.fcmp_unordered("!=", amax, ir.Constant(F32, 0.0)),
                             builder.fdiv(ir.Constant(F32, 127.0), amax), ir.Constant(F32, 0.0))
        q = [_cvtps2dq(builder, builder.fmul(u, _splat(builder, inv))) for u in v]
        total = _reduce(builder, "add", _fold(builder, builder.add, q))
        out = builder.bitcast(_element_ptr(context, builder, xq_t, xq_a, o_v), ir.VectorType(I8, 8).as_pointer())
        for i, u in enumerate(q):
            clamped = builder.select(builder.icmp_signed("<", u, ir.Constant(V8I, [-128] * 8)),
                                     ir.Constant(V8I, [-128] * 8), u)
            clamped = builder.select(builder.icmp_signed(">", clamped, ir.Constant(V8I, [127] * 8)),
                                     ir.Constant(V8I, [127] * 8), clamped)
            builder.store(builder.trunc(clamped, ir.VectorType(I8, 8)),
                          builder.gep(out, [ir.Constant(I64, i)]), align=1)
        d_s = [d, builder.fmul(d, builder.sitofp(total, F32))]
        rounded = [builder.fpext(builder.fptrunc(v, ir.HalfType()), F32) for v in d_s]
        return context.make_tuple(builder, signature.return_type, rounded)

    return types.UniTuple(types.float32, 2)(x, o, xq), codegen


@intrinsic
def q8_k_max(typingctx, x, o):
    """A Q8_K super-block x[o:o + 256]: (whether it holds a NaN, its first value of the largest magnitude), as
    quantize_row_q8_K_ref's scan (strict >) finds it."""
    def codegen(context, builder, signature, args):
        x_a, o_v = args
        x_t, _ = signature.args
        v = _block_vectors(context, builder, x_t, x_a, o_v, 32)
        nan = _fold(builder, builder.or_, [builder.fcmp_unordered("uno", u, u) for u in v])
        bits = [_abs_bits(builder, u) for u in v]
        amax = _splat(builder, _reduce(builder, "umax", _fold(builder, lambda a, b: _umax(builder, a, b), bits)), V8I)
        # the first lane equal to the largest: 32 eight-lane masks as four 64-bit words, lowest set bit
        index = ir.Constant(I64, 0)
        for word in reversed(range(4)):
            w = ir.Constant(I64, 0)
            for k in range(8):
                mask = builder.bitcast(builder.icmp_unsigned("==", bits[8 * word + k], amax), I8)
                w = builder.or_(w, builder.shl(builder.zext(mask, I64), ir.Constant(I64, 8 * k)))
            first = builder.add(_llvm(builder, "llvm.cttz.i64", I64, [w, ir.Constant(I1, 0)]),
                                ir.Constant(I64, 64 * word))
            index = builder.select(builder.icmp_unsigned("!=", w, ir.Constant(I64, 0)), first, index)
        vmax = builder.load(_element_ptr(context, builder, x_t, x_a, builder.add(_i64(builder, o_v), index)))
        return context.make_tuple(builder, signature.return_type, [_reduce(builder, "or", nan), vmax])

    return types.Tuple((types.boolean, types.float32))(x, o), codegen


@intrinsic
def q8_k_block(typingctx, x, o, iscale, d, q, values, bsums, g):
    """quantize_row_q8_K_ref's values of a super-block x[o:o + 256] with no NaN: q = min(127, nearest_int(iscale *
    x)) (the 1.5 * 2^23 trick) stored as int8 (wrapping, as C's assignment), values = q * d (float), bsums[g:g + 16]
    the sums of 16."""
    def codegen(context, builder, signature, args):
        x_a, o_v, iscale_v, d_v, q_a, values_a, bsums_a, g_v = args
        x_t, _, _, _, q_t, values_t, bsums_t, _ = signature.args
        v = _block_vectors(context, builder, x_t, x_a, o_v, 32)
        qp = builder.bitcast(_element_ptr(context, builder, q_t, q_a, o_v), ir.VectorType(I8, 8).as_pointer())
        vp = _element_ptr(context, builder, values_t, values_a, o_v)
        bp = _element_ptr(context, builder, bsums_t, bsums_a, g_v)
        scale, d8 = _splat(builder, iscale_v), _splat(builder, d_v)
        magic = _v8([12582912.0] * 8)
        wide = []
        for i, u in enumerate(v):
            bits = builder.bitcast(builder.fadd(builder.fmul(scale, u), magic), V8I)
            n = builder.sub(builder.and_(bits, ir.Constant(V8I, [0x7FFFFF] * 8)), ir.Constant(V8I, [0x400000] * 8))
            n = builder.select(builder.icmp_signed(">", n, ir.Constant(V8I, [127] * 8)), ir.Constant(V8I, [127] * 8), n)
            small = builder.trunc(n, ir.VectorType(I8, 8))
            builder.store(small, builder.gep(qp, [ir.Constant(I64, i)]), align=1)
            wide.append(builder.sext(small, V8I))
            builder.store(builder.fmul(builder.sitofp(wide[-1], V8F), d8),
                          builder.bitcast(builder.gep(vp, [ir.Constant(I64, 8 * i)]), V8F.as_pointer()), align=4)
        for k in range(16):
            total = _reduce(builder, "add", builder.add(wide[2 * k], wide[2 * k + 1]))
            builder.store(total, builder.gep(bp, [ir.Constant(I64, k)]))
        return context.get_dummy_value()

    return types.void(x, o, iscale, d, q, values, bsums, g), codegen
