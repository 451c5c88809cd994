"""Runtime kernels: decoders bit-exact with ggtools.quants, matmuls against a float64 reference that
rounds the input as llama.cpp does, batch invariance, ggml's exp."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from ggtools import quants
from ggtools.runtime.kernels import matmul, workers
from ggtools.runtime.kernels.ggmlmath import expf, silu

BLOCK32 = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
FLOATS = [T.F32, T.F16, T.BF16]
ALL = FLOATS + BLOCK32 + KQUANTS


def make_weights(qtype, n_rows=12, n_cols=512, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, n_cols)) * rng.uniform(0.01, 2.0, (n_rows, 1))).astype(np.float32)
    data = quantize(qtype, x)
    return data, quants.dequantize(qtype, data, n_cols).reshape(n_rows, n_cols)


def quantize(qtype, x):
    if qtype == T.MXFP4:     # ggtools.quants has no MXFP4 quantizer; gguf-py's is exact with ggml's
        import gguf
        return gguf.quants.quantize(x, qtype).reshape(-1)
    return quants.quantize(qtype, x).reshape(-1)


def reference_input(qtype, x):
    """The input values llama.cpp's dot products see, computed plainly in numpy."""
    kind = matmul.ACTIVATION[qtype]
    if kind == matmul.ACT_F16:
        return x.astype(np.float16).astype(np.float32)
    if kind == matmul.ACT_BF16:
        bits = x.view(np.uint32).astype(np.uint64)
        return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    if kind in (matmul.ACT_Q8_0, matmul.ACT_Q8_1):
        b = x.reshape(x.shape[0], -1, 32)
        amax = np.abs(b).max(-1, keepdims=True)
        d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(amax > 0, np.float32(127) / amax, 0).astype(np.float32)
        return (np.rint(b * inv) * d).reshape(x.shape)
    if kind == matmul.ACT_Q8_K:
        b = x.reshape(x.shape[0], -1, 256)
        idx = np.abs(b).argmax(-1)[..., None]
        vmax = np.take_along_axis(b, idx, -1)
        iscale = np.float32(-127) / vmax
        q = np.minimum(127, np.rint(b * iscale))
        return (q * (np.float32(1) / iscale)).astype(np.float32).reshape(x.shape)
    return x


def run_matmul(qtype, data, n_rows, x, stepwise=False):
    layout = matmul.Layout(qtype, n_rows, x.shape[1])
    return matmul.matmul(layout, data, matmul.PreparedInput(x, layout.activation), stepwise)


@pytest.mark.parametrize("qtype", ALL + [T.MXFP4], ids=lambda t: t.name)
def test_decoders_are_bit_exact_with_quants(qtype):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((6, 512)) * 3).astype(np.float32)
    data = quantize(qtype, x)
    want = quants.dequantize(qtype, data, 512).reshape(6, 512)
    got = matmul.dequantize_rows(matmul.Layout(qtype, 6, 512), data, np.array([5, 0, 3, 3]))
    assert np.array_equal(got.view(np.uint32), want[[5, 0, 3, 3]].view(np.uint32))


def q8_1_min_term_correction(qtype, data, n_rows, x, xr):
    """Q4_1/Q5_1 dots use m * fp16(d * sum(q)) per block rather than m * sum(x'): the difference."""
    block_bytes = {T.Q4_1: 20, T.Q5_1: 24}[qtype]
    mins = data.reshape(n_rows, -1, block_bytes)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    b = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1)
    q = np.rint(b * (np.float32(127) / amax)[..., None])
    s16 = ((amax / np.float32(127)) * q.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float64)
    return (s16 - xr.reshape(b.shape).astype(np.float64).sum(-1)) @ mins.T


@pytest.mark.parametrize("qtype", ALL, ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [1, 3, 6])
def test_matmul_matches_float64_reference(qtype, n_in):
    """Same rounded input, same weights: the float32 dot differs from the float64 one by its own roundings only,
    within the classical bound for a float32 sum of n products, (n + 2) u sum |w x| (u = 2^-24; the 2: the block
    scale's product and the min term's add), whatever order it sums in."""
    data, w = make_weights(qtype)
    x = np.random.default_rng(2).standard_normal((n_in, w.shape[1])).astype(np.float32)
    got = run_matmul(qtype, data, w.shape[0], x)
    xr = reference_input(qtype, x)
    want = xr.astype(np.float64) @ w.T.astype(np.float64)
    magnitude = np.abs(xr).astype(np.float64) @ np.abs(w.T).astype(np.float64)
    if qtype in (T.Q4_1, T.Q5_1):
        correction = q8_1_min_term_correction(qtype, data, w.shape[0], x, xr)
        want += correction
        magnitude += np.abs(correction)
    assert (np.abs(got - want) <= (w.shape[1] + 2) * 2.0 ** -24 * magnitude).all()


@pytest.mark.parametrize("qtype", BLOCK32 + KQUANTS, ids=lambda t: t.name)
def test_quantized_matmul_rows_do_not_depend_on_the_batch(qtype):
    data, w = make_weights(qtype)
    x = np.random.default_rng(3).standard_normal((7, w.shape[1])).astype(np.float32)
    batch = run_matmul(qtype, data, w.shape[0], x)
    for t in range(7):
        assert np.array_equal(batch[t], run_matmul(qtype, data, w.shape[0], x[t:t + 1])[0])


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
def test_stepwise_float_matmul_equals_one_row_steps(qtype):
    """Batches use tinyBLAS's lane layout (as llama.cpp); stepwise forces the one-row layout."""
    data, w = make_weights(qtype)
    x = np.random.default_rng(4).standard_normal((5, w.shape[1])).astype(np.float32)
    stepwise = run_matmul(qtype, data, w.shape[0], x, stepwise=True)
    for t in range(5):
        assert np.array_equal(stepwise[t], run_matmul(qtype, data, w.shape[0], x[t:t + 1])[0])


def test_q8_1_block_sums_are_rounded_like_ggml():
    """Q4_1 dots add m * fp16(d * sum(q)) per block: the sum carries its own f16 rounding."""
    x = np.random.default_rng(5).standard_normal((1, 64)).astype(np.float32) * 7
    prepared = matmul.PreparedInput(x, matmul.ACT_Q8_1)
    b = x.reshape(2, 32)
    amax = np.abs(b).max(1)
    q = np.rint(b * (np.float32(127) / amax)[:, None])
    want = ((amax / np.float32(127)) * q.sum(1).astype(np.float32)).astype(np.float16).astype(np.float32)
    assert np.array_equal(prepared.xs[0], want)


def hard_rounding_rows(n_cols, seed):
    """Input rows for the Q8 roundings: ordinary values; ties after scaling (the largest 127 and others at k + 0.5);
    a block's largest magnitude held by a value and its negation (either first); zeros; subnormals; huge values;
    +-inf; one value alone in its block."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((12, n_cols)) * 3).astype(np.float32)
    x[1] = (np.arange(n_cols) % 255 - 127) / np.float32(2)
    x[2, ::7] = -np.abs(x[2]).max()
    x[3, 3::7], x[3, 5::7] = 9.0, -9.0
    x[4, ::2] = 0
    x[5] *= np.float32(1e-40)
    x[6] *= np.float32(1e37)
    x[7, 10], x[7, 100] = np.inf, -np.inf
    x[8], x[8, 33] = 0, -2.5
    x[9, :64] = np.float32(1e-45)
    x[10] = np.float32(4.0)
    x[11] = -x[1]
    return x


@pytest.mark.oracle
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_1, T.Q4_K], ids=["q8_0", "q8_1", "q8_K"])
def test_input_rounding_equals_ggml_from_float(qtype):
    """The vector roundings of input rows (simd.q8_0_block; q8_k_max and q8_k_block) give ggml's bytes: libggml-cpu's
    from_float for Q8_0, Q8_1 (AVX2) and Q8_K (quantize_row_q8_K_ref), block by block."""
    from tests.ggml_oracle import load_ggml_cpu

    x = hard_rounding_rows(512, seed=6)
    want = load_ggml_cpu().prepare(qtype, x)
    prepared = matmul.PreparedInput(x, matmul.ACTIVATION[qtype])
    if qtype == T.Q4_K:
        blocks = want.reshape(len(x), -1, 292)
        assert np.array_equal(blocks[:, :, :4].copy().view(np.float32)[..., 0].view(np.uint32),
                              prepared.xd.view(np.uint32))
        assert np.array_equal(blocks[:, :, 4:260].reshape(len(x), -1).view(np.int8), prepared.q8)
        assert np.array_equal(blocks[:, :, 260:].copy().view(np.int16).reshape(len(x), -1), prepared.xs)
        return
    size = 34 if qtype == T.Q8_0 else 36     # ggml's block_q8_1: two halves (gguf-py's sizes say two floats)
    blocks = want[:, :x.shape[1] // 32 * size].reshape(len(x), -1, size)
    assert np.array_equal(blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32), prepared.xd)
    if qtype == T.Q4_1:
        assert np.array_equal(blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32), prepared.xs)
    if matmul.HAVE_AVX2:
        assert np.array_equal(blocks[:, :, size - 32:].reshape(len(x), -1).view(np.int8), prepared.xq)


def test_ggml_expf_is_accurate_and_saturates():
    """Within ggml_v_expf's documented accuracy of the float64 exp ("the maximum error is 1.45358 plus 0.5 ulps",
    ggml-cpu/vec.h; an ulp of the exact value's binade; measured 1.77); silu(3) = 3 / (1 + e^-3) within two ulps:
    the exp's error shrinks in 1 + e^-3 to a twentieth, the add and the division round half an ulp each."""
    xs = np.linspace(-87, 88, 4001).astype(np.float32)  # normal float32 results
    got = np.array([expf(v) for v in xs])
    want = np.exp(xs.astype(np.float64))
    ulp = 2.0 ** (np.floor(np.log2(want)) - 23)
    assert (np.abs(got - want) <= 1.95358 * ulp).all()
    assert expf(np.float32(-np.inf)) == 0.0 and np.isinf(expf(np.float32(89.0)))
    want_silu = 3 / (1 + np.exp(-3.0))
    assert silu(np.float32(0.0)) == 0.0 and abs(silu(np.float32(3.0)) - want_silu) <= 2 * 2.0 ** -22


def test_vector_silu_and_swiglu_equal_ggml_v_silu_lane_by_lane():
    """ops.silu_rows / swiglu_rows run ggml_v_silu 8 values at a time on unit-stride rows (simd.silu_8 / swiglu_8):
    the bits of the one-lane silu (ggmlmath, checked above) for every value, the exp's slow paths, +-inf, NaN and
    subnormals included, in place too; a strided view takes the one-lane loop and agrees."""
    from ggtools.runtime.kernels import ops

    rng = np.random.default_rng(11)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 87.5, -87.5, 104.0, -104.0, 126.9, -127.5,
                        150.0, -150.0, 200.0, -200.0, 3.4e38, -3.4e38], np.float32)
    spread = (rng.standard_normal(3 * 64 - special.size) * 40).astype(np.float32)
    gate = np.concatenate([special, spread]).reshape(3, 64)
    up = (rng.standard_normal((3, 64)) * 3).astype(np.float32)
    want_silu = np.array([[silu(v) for v in row] for row in gate], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):     # silu(3.4e38) * 3 is inf, silu(inf) * 0 NaN
        want = want_silu * up
    assert np.array_equal(ops.swiglu(gate, up).view(np.uint32), want.view(np.uint32))
    out = np.empty_like(gate)
    ops.silu_rows(gate, out)
    assert np.array_equal(out.view(np.uint32), want_silu.view(np.uint32))
    in_place = gate.copy()
    ops.silu_rows(in_place, in_place)
    assert np.array_equal(in_place.view(np.uint32), want_silu.view(np.uint32))
    strided = np.empty((3, 128), np.float32)
    ops.swiglu_rows(np.repeat(gate, 2, axis=1)[:, ::2], np.repeat(up, 2, axis=1)[:, ::2], strided[:, ::2])
    assert np.array_equal(strided[:, ::2].view(np.uint32), want.view(np.uint32))


def avx2_and_portable_inputs(qtype, n_rows, n_cols):
    """Weights, float inputs, and those inputs prepared for the AVX2 block dots (int8 in value order) and for the
    portable ones (the same values as floats, lane-major)."""
    from ggtools.runtime.kernels import simd

    if not simd.HAVE_AVX2:
        pytest.skip("the AVX2 kernels need an AVX2 CPU")
    data, _ = make_weights(qtype, n_rows=n_rows, n_cols=n_cols)
    x = np.random.default_rng(6).standard_normal((5, n_cols)).astype(np.float32)
    prepared = matmul.PreparedInput(x, matmul.ACTIVATION[qtype])
    lanes = np.empty(prepared.xq.shape, np.float32)
    for b in range(0, n_cols, 32):
        lanes[:, b + matmul.LANE_POS] = prepared.xq[:, b:b + 32]
    return data, x, prepared, lanes


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4"])
@pytest.mark.parametrize("n_cols", [256, 224])
def test_portable_block_dot_equals_the_avx2_one(name, n_cols):
    """Without AVX2 the block dots run on float planes (lane-major inputs); same bits. (224: an odd number of
    blocks, MXFP4's last-block path.)"""
    from numba import njit
    from ggtools.runtime.kernels import simd

    qtype = T[name.upper()]
    data, x, prepared, lanes = avx2_and_portable_inputs(qtype, 3, n_cols)
    layout = simd.BLOCK32_LAYOUTS[name]
    portable, avx2 = simd._dot_row_block32(layout, 1), simd._dot_row_block32_avx2(layout, 1)

    @njit
    def both(data, row_bytes, n_blocks, xq8, xq, xd, xs, out):
        for r in range(out.shape[1]):
            for t in range(out.shape[2]):
                (out[0, r, t],) = portable(data, np.uint64(r * row_bytes), n_blocks, xq, xd, xs, t)
                (out[1, r, t],) = avx2(data, np.uint64(r * row_bytes), n_blocks, xq8, xd, xs, t)

    out = np.empty((2, 3, 5), np.float32)
    both(data, data.size // 3, n_cols // 32, prepared.xq, lanes, prepared.xd, prepared.xs, out)
    assert np.array_equal(out[0], out[1])
    assert np.abs(out[1] - run_matmul(qtype, data, 3, x).T).max() == 0


def extreme_q8_0_rows(n_rows, n_cols):
    """Q8_0 rows of scale 1 whose values run through every byte, -128 included: the largest products."""
    blocks = np.zeros((n_rows * n_cols // 32, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    blocks[:, 2:] = (np.arange(blocks.shape[0] * 32) % 256).reshape(-1, 32)
    return blocks.reshape(-1)


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "q8_0 extremes"])
def test_vnni_block_dot_equals_maddubs(name):
    """Where the CPU has VNNI the block dots sum each 4-value lane in one vpdpbusd (as ggml's VNNI builds; the 4- and
    8-row kernels with signed weights as w + 128 against lanes started at -128 times the input's 4-value sums); the
    lanes equal the maddubs + madd sums of ggml's AVX2 builds (the test oracle) bit for bit, also for the largest
    products (weights -128 and 127 against inputs +-127)."""
    from numba import njit
    from ggtools.runtime.kernels import simd

    if not simd.HAVE_VNNI:
        pytest.skip("the VNNI lanes need a CPU with AVX512-VNNI (and VL) or AVX-VNNI")
    layout_name = name.split()[0]
    qtype = T[layout_name.upper()]
    data, x, prepared, _ = avx2_and_portable_inputs(qtype, 8, 256)
    if name.endswith("extremes"):
        data = extreme_q8_0_rows(8, 256)
        x = np.where(np.arange(256) % 3 == 0, -1.0, 1.0).astype(np.float32)[None].repeat(5, 0)
        prepared = matmul.PreparedInput(x, matmul.ACTIVATION[qtype])
        assert np.abs(prepared.xq).max() == 127 and (data.view(np.int8) == -128).any()
    layout = simd.BLOCK32_LAYOUTS[layout_name]
    vnni_1, vnni_4 = simd._dot_row_block32_avx2(layout, 1), simd._dot_row_block32_avx2(layout, 4)
    maddubs_1, maddubs_4 = simd._dot_row_block32_maddubs(layout, 1), simd._dot_row_block32_maddubs(layout, 4)

    @njit
    def both(data, row_bytes, n_blocks, xq, xd, xs, xc, xdT, out):
        for r in range(out.shape[1]):
            so = np.uint64(r * row_bytes)
            out[0, r, 0], out[0, r, 1], out[0, r, 2], out[0, r, 3] = vnni_4(data, so, n_blocks, xq, xd, xs, 0, xc, xdT)
            out[1, r, 0], out[1, r, 1], out[1, r, 2], out[1, r, 3] = maddubs_4(data, so, n_blocks, xq, xd, xs, 0, xc,
                                                                               xdT)
            (out[0, r, 4],) = vnni_1(data, so, n_blocks, xq, xd, xs, 4)
            (out[1, r, 4],) = maddubs_1(data, so, n_blocks, xq, xd, xs, 4)

    out = np.empty((2, 8, 5), np.float32)
    xc, xdT = matmul.batch_forms(prepared.xq, prepared.xd)
    both(data, data.size // 8, 256 // 32, prepared.xq, prepared.xd, prepared.xs, xc, xdT, out)
    assert np.array_equal(out[0].view(np.uint32), out[1].view(np.uint32))


@pytest.mark.parametrize("name", ["q4_0", "mxfp4"])
def test_portable_repacked_dot_equals_the_avx2_one(name):
    """The 8-row kernels of llama.cpp's repacked order: float planes and AVX2 integers give the same bits, and
    those of the matmul of a 16-row matrix (two groups of 8 rows)."""
    from numba import njit
    from ggtools.runtime.kernels import simd

    qtype = T[name.upper()]
    data, x, prepared, lanes = avx2_and_portable_inputs(qtype, 16, 224)
    layout = simd.BLOCK32_LAYOUTS[name]
    portable = simd._dot_row_block32(layout, 1, weight_rows=8)
    avx2 = simd._dot_row_block32_avx2(layout, 1, weight_rows=8)

    @njit
    def both(data, row_bytes, n_blocks, xq8, xq, xd, xs, out):
        for g in range(2):
            for t in range(out.shape[1]):
                so = np.uint64(8 * g * row_bytes)
                sums = portable(data, so, n_blocks, xq, xd, xs, t)
                sums8 = avx2(data, so, n_blocks, xq8, xd, xs, t)
                for k in range(8):
                    out[0, t, 8 * g + k], out[1, t, 8 * g + k] = sums[k], sums8[k]

    out = np.empty((2, 5, 16), np.float32)
    both(data, data.size // 16, 224 // 32, prepared.xq, lanes, prepared.xd, prepared.xs, out)
    assert np.array_equal(out[0], out[1])
    assert np.array_equal(out[1], run_matmul(qtype, data, 16, x))


@pytest.mark.parametrize("qtype", FLOATS, ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [13, 14, 15])
def test_float_batch_rows_do_not_depend_on_their_grouping(qtype, n_in):
    """A batch is dotted two weight rows at a time (the 13th weight row alone) against groups of 4 input
    rows sharing the loads, then the 1-3 rows left: each row must get the bits of a 2-row batch (the smallest
    batch in the same tinyBLAS layout)."""
    data, w = make_weights(qtype, n_rows=13)
    x = np.random.default_rng(5).standard_normal((n_in, w.shape[1])).astype(np.float32)
    batch = run_matmul(qtype, data, w.shape[0], x)
    for t in range(n_in):
        assert np.array_equal(batch[t], run_matmul(qtype, data, w.shape[0], x[[t, t]])[0])


@pytest.mark.parametrize("qtype", [T.Q8_0, T.F16, T.Q4_K], ids=lambda t: t.name)
def test_matmul_bits_do_not_depend_on_the_thread_count(qtype):
    """Large enough to be split over the workers (workers.MATMUL_MIN_WORK), and a small one run in place."""
    data, w = make_weights(qtype, n_rows=4096, n_cols=512)
    x = np.random.default_rng(6).standard_normal((3, 512)).astype(np.float32)
    assert 3 * 4096 * 512 >= workers.MATMUL_MIN_WORK
    try:
        results = []
        for n in (1, 2, 3):
            workers.set_threads(n)
            results.append((run_matmul(qtype, data, 4096, x), run_matmul(qtype, data[:len(data) // 64], 64, x[:1])))
    finally:
        workers.set_threads(workers.default_threads())
    for big, small in results[1:]:
        assert np.array_equal(big, results[0][0]) and np.array_equal(small, results[0][1])


@pytest.mark.oracle
@pytest.mark.parametrize("qtype", [T.Q4_0, T.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("n_rows, n_cols", [(5, 256), (7, 224), (16, 256), (24, 96)])
@pytest.mark.parametrize("n_in", [1, 3, 6, 8])
def test_repackable_matmul_equals_ggml(qtype, n_rows, n_cols, n_in):
    """Bit for bit with libggml-cpu: matrices with a multiple of 8 rows against the repacked 8x8 kernels llama.cpp
    runs them through on AVX2 (gemm for each 4 input rows, gemv for the rest: n_in 1, 3, 6, 8 take every mix), the
    others against the type's vec_dot (even and odd block counts)."""
    from tests.ggml_oracle import load_ggml_cpu

    ggml = load_ggml_cpu()
    data, _ = make_weights(qtype, n_rows=n_rows, n_cols=n_cols, seed=n_rows)
    x = (np.random.default_rng(n_cols).standard_normal((n_in, n_cols)) * 3).astype(np.float32)
    rows = data.reshape(n_rows, -1)
    layout = matmul.Layout(qtype, n_rows, n_cols)
    if n_rows % 8 == 0 and matmul.HAVE_AVX2:
        assert layout.kernel_id == matmul.REPACKED_KERNEL[qtype]
        want = ggml.matmul_repacked(qtype, rows, x)
        if n_cols >= 256:   # on rows this long the two orders give different bits: the comparison tells them apart
            assert not np.array_equal(want, ggml.vec_dot(qtype, rows, x))
    else:
        want = ggml.vec_dot(qtype, rows, x)
    got = run_matmul(qtype, data, n_rows, x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.oracle
@pytest.mark.parametrize("qtype, n_rows, n_cols", [(T.Q6_K, 5, 256), (T.Q6_K, 16, 1536), (T.Q4_K, 5, 256),
                                                   (T.Q4_K, 12, 1536)], ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("n_in", [1, 3, 7])
def test_k_quant_matmul_equals_ggml_vec_dot(qtype, n_rows, n_cols, n_in):
    """Q6_K, and Q4_K that llama.cpp does not repack (rows not a multiple of 8), on integers (kquant_dot.py): bit
    for bit with libggml-cpu's ggml_vec_dot_<type>_q8_K, which llama.cpp runs batches of fewer than 8 rows
    through, and stepwise batches of any size."""
    from tests.ggml_oracle import load_ggml_cpu

    data, _ = make_weights(qtype, n_rows=n_rows, n_cols=n_cols, seed=n_rows)
    x = (np.random.default_rng(n_cols).standard_normal((n_in, n_cols)) * 3).astype(np.float32)
    want = load_ggml_cpu().vec_dot(qtype, data.reshape(n_rows, -1), x)
    assert np.array_equal(run_matmul(qtype, data, n_rows, x).view(np.uint32), want.view(np.uint32))
    x = np.concatenate([x] * 3)
    assert np.array_equal(run_matmul(qtype, data, n_rows, x, stepwise=True), np.concatenate([want] * 3))


@pytest.mark.oracle
@pytest.mark.parametrize("n_rows, n_cols", [(8, 256), (16, 1536)])
@pytest.mark.parametrize("n_in", [1, 3, 4, 6, 8, 16])
def test_repacked_q4_k_matmul_equals_ggml(n_rows, n_cols, n_in):
    """Q4_K on integers (kquant_dot.py), rows a multiple of 8: bit for bit with libggml-cpu's q4_K 8x8 kernels as
    llama.cpp's forward_mul_mat runs them (gemm for each 4 input rows when more than 3, gemv for the rest), and
    every row through gemv when the rows go one at a time (stepwise, as mul_mat_id does)."""
    from tests.ggml_oracle import load_ggml_cpu

    ggml = load_ggml_cpu()
    data, _ = make_weights(T.Q4_K, n_rows=n_rows, n_cols=n_cols, seed=n_rows)
    x = (np.random.default_rng(n_cols).standard_normal((n_in, n_cols)) * 3).astype(np.float32)
    rows = data.reshape(n_rows, -1)
    assert matmul.Layout(T.Q4_K, n_rows, n_cols).kernel_id == matmul.REPACKED_KERNEL[T.Q4_K]
    want = ggml.matmul_repacked(T.Q4_K, rows, x)
    got = run_matmul(T.Q4_K, data, n_rows, x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    one_at_a_time = np.concatenate([ggml.matmul_repacked(T.Q4_K, rows, x[t:t + 1]) for t in range(n_in)])
    assert np.array_equal(run_matmul(T.Q4_K, data, n_rows, x, stepwise=True), one_at_a_time)



def test_direct_call_runs_the_dispatchers_overload_and_checks_types_under_test():
    """DirectCall (the one-call paths' kernel calls) gives the dispatcher's results through the entry point of the
    overload its first call ran; under test (GGTOOLS_CHECK_DIRECT_CALLS=1, conftest) a call with other argument types
    is refused rather than run on that overload."""
    from numba import njit

    from ggtools.runtime.kernels import direct_call

    @njit
    def scaled_sum(x, scale):
        return (x * scale).sum()

    call = direct_call.DirectCall(scaled_sum)
    assert call.check_types
    x = np.linspace(-3, 3, 32, dtype=np.float32)
    assert call(x, np.float32(0.5)) == scaled_sum(x, np.float32(0.5))
    assert call.entry is not scaled_sum          # the overload's entry point, not the dispatcher
    assert call(x[::-1].copy(), np.float32(2)) == scaled_sum(x[::-1].copy(), np.float32(2))
    with pytest.raises(TypeError, match="differ from the first call's"):
        call(x[::2], np.float32(2))              # a strided view: another layout


def test_fixed_args_pass_the_tuple_by_reference():
    """FixedArgs (a one-call kernel's fixed arguments as one object): inside numba its .args, and unpacked(), give the
    tuple it was made from, its arrays the same memory (a kernel's writes to scratch in it are seen from Python);
    unpacked() of a plain tuple is that tuple."""
    from numba import njit

    from ggtools.runtime.kernels.fixed_args import fixed_args, unpacked

    @njit
    def weighted_into(args, x):
        weights, scratch, offset = unpacked(args)
        for i in range(x.size):
            scratch[i] = x[i] * weights[i] + offset
        return scratch.sum()

    weights, scratch = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    x = np.array([1, -2, 3, -4], np.float32)
    args = (weights, scratch, np.float32(0.5))
    expected = x * weights + np.float32(0.5)
    assert weighted_into(fixed_args(args), x) == expected.sum()
    assert np.array_equal(scratch, expected)
    scratch[:] = 0
    assert weighted_into(args, x) == expected.sum() and np.array_equal(scratch, expected)


def test_all_finite_equals_numpy_on_every_kind_of_float32():
    """ops.all_finite (the logits check of every forward) against np.isfinite(x).all(): NaN (quiet, signalling,
    negative), +-inf, the largest finite values, subnormals and zeros, anywhere in C, strided and Fortran arrays."""
    from ggtools.runtime.kernels.ops import all_finite

    rng = np.random.default_rng(5)
    specials = np.array([0x7FC00000, 0x7F800001, 0xFFC00000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF,
                         0x00000001, 0x80000001, 0x00000000, 0x80000000], np.uint32).view(np.float32)
    for value in specials:
        for shape in ((1, 1024), (16, 577)):
            x = rng.standard_normal(shape).astype(np.float32)
            x[rng.integers(shape[0]), rng.integers(shape[1])] = value
            for view in (x, x[:, 1::3], np.asfortranarray(x)):
                assert all_finite(view) == np.isfinite(view).all(), (value, shape)


@pytest.mark.oracle
@pytest.mark.parametrize("qtype", BLOCK32, ids=lambda t: t.name)
def test_blocks_of_tiny_inputs_round_as_ggml(qtype):
    """Input blocks whose largest value is under 127 / FLT_MAX (the inverse scale is inf, every product inf or NaN)
    round as ggml's AVX2 quantize_row_q8_0 / q8_1 round them, bit for bit with libggml-cpu's vec_dot: next to an
    ordinary block, a block of subnormals, one of tiny normals, and a zero block holding one negative subnormal."""
    from tests.ggml_oracle import load_ggml_cpu

    data, _ = make_weights(qtype, n_rows=5, n_cols=128, seed=3)
    x = (np.random.default_rng(1).standard_normal((3, 128)) * 3).astype(np.float32)
    x[0, 32:64] *= np.float32(1e-38)
    x[1, :32], x[1, 7] = np.float32(1e-39), np.float32(1e-37)
    x[2, 64:96], x[2, 70] = 0, -np.float32(1e-45)
    want = load_ggml_cpu().vec_dot(qtype, data.reshape(5, -1), x)
    assert np.array_equal(run_matmul(qtype, data, 5, x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", BLOCK32 + KQUANTS + FLOATS, ids=lambda t: t.name)
@pytest.mark.parametrize("position", [0, 5, 31, 300])
def test_a_nan_input_makes_every_output_nan(qtype, position):
    """A NaN in an input row gives its Q8_0 / Q8_1 / Q8_K block a NaN scale (float types carry it as it is), so every
    output of the row is NaN and the forward's logits check stops the step, instead of the NaN being rounded to some
    integer (or to 0, as ggml's Q8_K rounding does) and the row's outputs staying finite."""
    data, _ = make_weights(qtype, n_rows=8, n_cols=512, seed=3)
    x = (np.random.default_rng(1).standard_normal((2, 512)) * 3).astype(np.float32)
    x[0, position] = np.nan
    out = run_matmul(qtype, data, 8, x)
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
