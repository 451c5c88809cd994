"""ggtools.quants against gguf-py (always installed): its dequantizers are bit-exact with ggml for
every type, its quantizers for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/F16/BF16."""

import warnings
from concurrent.futures import ThreadPoolExecutor

import gguf
import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ggtools import quants
from ggtools.quants import QuantError

DECODE_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K,
                T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf-py on inf/NaN/overflow

GGUF_PY_QUANTIZE_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def gguf_dequantize(qtype, data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)


def assert_same_floats(ours, ref):
    """Bitwise equal, except that any NaN equals any NaN (numpy's float16 cast keeps signalling
    NaNs that ggml's conversion quiets)."""
    assert ours.shape == ref.shape
    same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
    bad = np.flatnonzero(~same.reshape(-1))
    assert bad.size == 0, (f"{bad.size} values differ, first at {bad[0]}: "
                           f"{ours.reshape(-1)[bad[0]]!r} vs {ref.reshape(-1)[bad[0]]!r}")


def sample_rows(rng, n=1024):
    """Eight normal rows at several scales plus the block shapes that hit edge paths."""
    x = rng.standard_normal((8, n)).astype(np.float32)
    x *= np.float32([1e-9, 1e-3, 1.0, 3e5, 1.0, 1.0, 1e-30, 1e5])[:, None]
    x[4, :32] = 0.0  # zero block
    x[4, 32:64] = 0.75  # constant blocks
    x[4, 64:96] = -2.5
    x[4, 96:128] = 0.0
    x[4, 100] = 7.0  # spike
    x[5] = np.round(x[5] * 8) / 8 + 0.5 / 8  # values on .5 ties of fine grids
    return x


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.mark.parametrize("qtype", DECODE_TYPES, ids=lambda t: t.name)
def test_dequantize_random_bytes_matches_gguf_py(qtype, rng):
    blck, tsize = GGML_QUANT_SIZES[qtype]
    n = 4 * 256
    data = rng.integers(0, 256, (16, n // blck * tsize), dtype=np.uint8)
    assert_same_floats(quants.dequantize(qtype, data), gguf_dequantize(qtype, data))


@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q4_0, T.Q8_0],
                         ids=lambda t: t.name)
def test_dequantize_finite_scales_matches_gguf_py(qtype, rng):
    """Random blocks whose fp16 scales are finite, so every output value is compared as a number."""
    blck, tsize = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (64, 2 * 256 // blck * tsize), dtype=np.uint8)
    halves = rng.standard_normal(data.size // 2).astype(np.float16).view(np.uint8)
    blocks = data.reshape(-1, tsize)
    for off in {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2),
                T.Q6_K: (208,), T.Q4_0: (0,), T.Q8_0: (0,)}[qtype]:
        blocks[:, off:off + 2] = halves[: 2 * len(blocks)].reshape(-1, 2)
    ours = quants.dequantize(qtype, data)
    assert np.isfinite(ours).all()
    assert_same_floats(ours, gguf_dequantize(qtype, data))


@pytest.mark.parametrize("qtype", GGUF_PY_QUANTIZE_TYPES + [T.MXFP4], ids=lambda t: t.name)
def test_dequantize_gguf_py_quantized_data(qtype, rng):
    x = sample_rows(rng)
    data = gguf.quants.quantize(x, qtype)
    assert_same_floats(quants.dequantize(qtype, data), gguf_dequantize(qtype, data))


@pytest.mark.parametrize("qtype", GGUF_PY_QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_matches_gguf_py(qtype, rng):
    x = sample_rows(rng)
    ours = quants.quantize(qtype, x)
    ref = gguf.quants.quantize(x, qtype).view(np.uint8).reshape(ours.shape)
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_bytes_do_not_depend_on_thread_count(qtype, rng):
    x = sample_rows(rng)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = quants.quantize(qtype, x)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one, quants.quantize(qtype, x))


def test_calls_from_several_threads_match_gguf_py(rng):
    x = sample_rows(rng, n=256)
    expected = gguf.quants.quantize(x, T.Q8_0)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: quants.quantize("q8_0", x), range(8)))
    assert all(np.array_equal(r, expected) for r in results)


def test_zero_rows():
    assert quants.quantize("q4_k", np.zeros((0, 512), np.float32)).shape == (0, 288)
    assert quants.dequantize("q4_k", np.zeros((0, 288), np.uint8)).shape == (0, 512)
    assert quants.requantize("q8_0", "q4_k", b"", n_per_row=256).shape == (0, 144)


def test_qtype_forms_are_equivalent(rng):
    x = rng.standard_normal((2, 256)).astype(np.float32)
    expected = quants.quantize(T.Q4_K, x)
    for form in (12, "q4_k", "Q4_K", " q4_K "):
        assert np.array_equal(quants.quantize(form, x), expected)


def test_one_dimensional_input_is_one_row(rng):
    x = rng.standard_normal(256).astype(np.float32)
    y = quants.quantize("q8_0", x)
    assert y.shape == (1, 8 * 34)
    assert quants.dequantize("q8_0", y.reshape(-1)).shape == (1, 256)


def test_dequantize_accepts_buffers(rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    y = gguf.quants.quantize(x, T.Q4_0)
    ref = gguf_dequantize(T.Q4_0, y)
    for buf in (y.tobytes(), memoryview(y.tobytes()), bytearray(y.tobytes())):
        assert_same_floats(quants.dequantize("q4_0", buf, n_per_row=64), ref)


def test_memmap_in_and_out(tmp_path, rng):
    x = rng.standard_normal((4, 128)).astype(np.float32)
    src = np.memmap(tmp_path / "src.bin", np.uint8, "w+", shape=(4, 4 * 34))
    src[:] = gguf.quants.quantize(x, T.Q8_0)
    dst = np.memmap(tmp_path / "dst.bin", np.uint8, "w+", shape=(4, 4 * 18))
    quants.requantize("q8_0", "q4_0", src[1:3], out=dst[1:3])
    dst.flush()
    expected = gguf.quants.quantize(gguf_dequantize(T.Q8_0, src[1:3]), T.Q4_0)
    assert np.array_equal(np.fromfile(tmp_path / "dst.bin", np.uint8).reshape(4, -1)[1:3], expected)


@pytest.mark.parametrize("chunk_values", [64, 100, 1 << 22])
def test_requantize_in_chunks_matches_gguf_py(chunk_values, rng):
    # no rows so small that Q8_0's d rounds to 0: their -0.0 values make gguf-py's Q5_1 min
    # differ from ggml's (np.min vs the C loop's first-of-equal on signed zeros)
    x = (rng.standard_normal((8, 256)) * [[1e-3], [1], [3e5], [1], [1], [1], [1], [1]]).astype(np.float32)
    q8 = gguf.quants.quantize(x, T.Q8_0)
    expected = gguf.quants.quantize(gguf_dequantize(T.Q8_0, q8), T.Q5_1)
    assert np.array_equal(quants.requantize(T.Q8_0, T.Q5_1, q8, chunk_values=chunk_values), expected)


def test_iter_row_chunks_covers_rows_once():
    parts = list(quants.iter_row_chunks(10, 300, chunk_values=1000))
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [(p.start, p.stop) for p in quants.iter_row_chunks(2, 5000, 1000)] == [(0, 1), (1, 2)]


@pytest.mark.parametrize("qtype, ne0, row_bytes", [
    ("q4_0", 4096, 2304), ("q8_0", 4096, 4352), ("q4_k", 4096, 2304), ("q6_k", 4096, 3360),
    ("q2_k", 256, 84), ("q3_k", 256, 110), ("q5_k", 256, 176), ("mxfp4", 64, 34),
    ("f16", 3, 6), ("bf16", 5, 10), ("f32", 7, 28),
])
def test_row_bytes(qtype, ne0, row_bytes):
    assert quants.row_bytes(qtype, ne0) == row_bytes


@pytest.mark.parametrize("qtype, ne0, expected", [
    ("q4_k", 4096, T.Q4_K), ("q4_k", 640, T.Q5_0), ("q5_k", 640, T.Q5_1), ("q6_k", 640, T.Q8_0),
    ("q2_k", 640, T.Q4_0), ("q3_k", 96, T.Q4_0), ("q4_k", 100, T.F16), ("q6_k", 48, T.F16),
    ("q8_0", 100, T.F16), ("q8_0", 96, T.Q8_0), ("iq2_xxs", 640, T.IQ4_NL), ("f16", 7, T.F16),
])
def test_fallback_type(qtype, ne0, expected):
    assert quants.fallback_type(qtype, ne0) == expected


def test_fallback_type_undefined():
    with pytest.raises(QuantError, match="no tensor type fallback"):
        quants.fallback_type("nvfp4", 96)


def test_capabilities():
    assert quants.can_quantize("q4_k", 512) and not quants.can_quantize("q4_k", 640)
    assert not quants.can_quantize("mxfp4", 64) and quants.has_dequantizer("mxfp4")
    assert not quants.has_quantizer("iq2_xxs") and not quants.has_dequantizer("iq2_xxs")
    assert quants.block_size("q5_k") == 256 and quants.type_size("q5_k") == 176


@pytest.mark.parametrize("call, message", [
    (lambda: quants.quantize("q4_k", np.zeros((2, 640), np.float32)),
     "Q4_K needs rows that are a multiple of 256 values, got 640"),
    (lambda: quants.quantize("q9_9", np.zeros(32, np.float32)), "unknown tensor type 'q9_9'"),
    (lambda: quants.quantize(99, np.zeros(32, np.float32)), "unknown tensor type 99"),
    (lambda: quants.quantize("q8_0", np.zeros(32)), "expects float32 values, got float64"),
    (lambda: quants.quantize("mxfp4", np.zeros(32, np.float32)), "quantizing to MXFP4 is not supported"),
    (lambda: quants.dequantize("iq2_xxs", bytes(66)), "dequantizing IQ2_XXS is not supported"),
    (lambda: quants.dequantize("q4_0", bytes(19)), "Q4_0 rows must be a multiple of 18 bytes, got 19"),
    (lambda: quants.dequantize("q4_0", bytes(54), n_per_row=64), "54 bytes is not a whole number"),
    (lambda: quants.quantize("q4_0", np.zeros((2, 64), np.float32), out=np.zeros(10, np.uint8)),
     "out must be"),
])
def test_errors_are_quant_errors(call, message):
    with pytest.raises(QuantError, match=message.replace("(", r"\(")):
        call()
    assert issubclass(QuantError, ValueError)


def half_block(qtype, field_offsets, bad_block, bad_bits, nblocks=5):
    tsize = GGML_QUANT_SIZES[qtype][1]
    data = np.zeros((nblocks, tsize), np.uint8)
    for off in field_offsets:
        data[bad_block, off:off + 2] = np.frombuffer(np.uint16(bad_bits).tobytes(), np.uint8)
    return data


@pytest.mark.parametrize("qtype, offset", [
    (T.Q4_0, 0), (T.Q4_1, 2), (T.Q8_0, 0), (T.Q2_K, 80), (T.Q2_K, 82), (T.Q3_K, 108),
    (T.Q4_K, 0), (T.Q4_K, 2), (T.Q5_K, 2), (T.Q6_K, 208), (T.IQ4_NL, 0), (T.TQ2_0, 64),
])
@pytest.mark.parametrize("bits", [0x7C00, 0xFC00, 0x7E00, 0x7C01])
def test_check_row_data_flags_nonfinite_scales(qtype, offset, bits):
    data = half_block(qtype, [offset], 3, bits)
    assert quants.check_row_data(qtype, data) == (1, 3)


def test_check_row_data_ignores_finite_scales():
    data = half_block(T.Q4_K, [0, 2], 1, 0x7BFF)  # 65504, the largest finite half
    assert quants.check_row_data("q4_k", data) == (0, -1)
    data = half_block(T.Q4_K, [20], 1, 0x7C00)  # not a scale field
    assert quants.check_row_data("q4_k", data) == (0, -1)


def test_check_row_data_floats_and_mxfp4():
    f = np.ones(100, np.float32)
    f[[7, 50]] = [np.inf, np.nan]
    assert quants.check_row_data("f32", f) == (2, 7)
    assert quants.check_row_data("f16", f.astype(np.float16)) == (2, 7)
    bf = (f.view(np.uint32) >> 16).astype(np.uint16)
    assert quants.check_row_data("bf16", bf) == (2, 7)
    assert quants.check_row_data("f32", np.ones(10, np.float32)) == (0, -1)
    mx = np.zeros((4, 17), np.uint8)
    mx[2, 0] = 0xFF
    mx[3, 1] = 0xFF  # a nibble byte, not the scale
    assert quants.check_row_data("mxfp4", mx) == (1, 2)
    assert quants.check_row_data("i32", np.zeros(4, np.int32)) == (0, -1)
    with pytest.raises(QuantError, match="whole number"):
        quants.check_row_data("q4_0", bytes(20))


@pytest.mark.parametrize("qtype, bad_bytes", [(T.Q8_0, [0x00, 0x7C]), (T.F32, [0x00, 0x00, 0x80, 0x7F])])
def test_check_row_data_counts_across_pieces(qtype, bad_bytes):
    """Data longer than one piece of the check (rowcheck.PIECE_BYTES): every bad item counted, the first one
    indexed from the start of the data."""
    from ggtools.quants.rowcheck import PIECE_BYTES
    tsize = GGML_QUANT_SIZES[qtype][1]
    n = 3 * PIECE_BYTES // tsize + 7
    data = np.zeros((n, tsize), np.uint8)
    bad = [PIECE_BYTES // tsize + 5, 2 * PIECE_BYTES // tsize + 1, n - 1]
    for i in bad:
        data[i, :len(bad_bytes)] = bad_bytes
    assert quants.check_row_data(qtype, data) == (3, bad[0])
