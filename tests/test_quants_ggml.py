"""ggtools.quants against ggml's own C library (ggml_quantize_chunk with imatrix NULL, the types'
to_float, ggml_validate_row_data), through tests/ggml_oracle.py. Every byte must be equal.

Skipped when llama-cpp-python is not installed. `-m slow` adds a larger random sweep.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from tests.ggml_oracle import load_ggml
from ggtools import quants

pytestmark = [pytest.mark.oracle, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

QUANTIZE_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
                  T.F16, T.BF16, T.F32]
DECODE_TYPES = [t for t in QUANTIZE_TYPES if t != T.F32] + [T.MXFP4]
N = 1024  # values per row: a multiple of every block size


@pytest.fixture(scope="module")
def ggml():
    return load_ggml()


def f32(values):
    return np.asarray(values, dtype=np.float32)


def blockwise(rng, rows, make_block, size=32):
    """rows x N values, each run of `size` values from make_block(rng, size)."""
    out = np.empty((rows, N // size, size), np.float32)
    for r in range(rows):
        for b in range(N // size):
            out[r, b] = make_block(rng, size)
    return out.reshape(rows, N)


def edge_cases(rng) -> dict[str, np.ndarray]:
    """Named float32 (rows, N) arrays covering the recipes' special paths."""
    normal = rng.standard_normal((4, N)).astype(np.float32)
    cases = {f"normal x {s:g}": normal * f32(s) for s in (1e-9, 1e-3, 1.0, 3e5, 1e-30, 1e5)}
    cases["fp16-subnormal scales"] = np.concatenate([normal * f32(s) for s in (1e-5, 3e-6, 1e-7)])
    cases["float32 denormals"] = normal * f32(1e-39)
    cases["huge, sums overflow"] = np.concatenate([normal * f32(1e30), normal * f32(3e37)])
    cases["all zero"] = np.zeros((2, N), np.float32)
    cases["signed zeros"] = np.where(rng.random((2, N)) < 0.5, f32(-0.0), f32(0.0))
    cases["negative zero blocks"] = np.full((1, N), -0.0, np.float32)
    magnitudes = np.abs(normal[:2])  # signed zeros as the min (or, negated, the max) of a block
    with_zeros = np.where(rng.random((2, N)) < 0.2, np.where(rng.random((2, N)) < 0.5, f32(-0.0), f32(0.0)),
                          magnitudes)
    cases["signed zeros at the block min / max"] = np.concatenate([with_zeros, -with_zeros])
    cases["constant blocks"] = blockwise(rng, 4, lambda g, n: np.full(n, g.choice(
        [0.75, -2.5, 1e-3, -1e5, 3.0, -7.0, 1e-20]), np.float32), size=32)
    cases["constant super-blocks"] = blockwise(rng, 2, lambda g, n: np.full(n, g.choice(
        [0.75, -2.5, 1e-3, -1e5]), np.float32), size=256)

    def spike(g, n):
        block = np.zeros(n, np.float32)
        block[g.integers(n)] = g.choice([-1, 1]) * 10.0 ** g.uniform(-8, 5)
        return block
    cases["single spikes"] = blockwise(rng, 4, spike, size=32)
    cases["single spikes per 256"] = blockwise(rng, 2, spike, size=256)

    def zero_sub_block(g, n):
        block = g.standard_normal(n).astype(np.float32)
        sub = g.choice([16, 32])
        start = sub * g.integers(n // sub)
        block[start:start + sub] = 0
        return block
    cases["one zero sub-block"] = blockwise(rng, 4, zero_sub_block, size=256)

    def mixed(g, n):
        return (g.standard_normal(n) * np.repeat(10.0 ** g.uniform(-12, 6, n // 16), 16)).astype(np.float32)
    cases["mixed tiny/huge sub-blocks"] = blockwise(rng, 4, mixed, size=256)

    def ties(g, n):  # power-of-two max and values on a half-step grid: x * id lands on .5
        grid = g.choice([0.5, 0.25, 0.125, 1 / 16, 1 / 32])
        block = g.integers(-16, 17, n) * grid
        block[g.integers(n)] = g.choice([-1, 1]) * 16 * grid
        return block.astype(np.float32)
    cases["exact .5 ties"] = blockwise(rng, 6, ties, size=32)
    cases["exact .5 ties per 256"] = blockwise(rng, 4, ties, size=256)
    cases["integers"] = rng.integers(-40, 41, (2, N)).astype(np.float32)

    def q8_boundary(g, n):  # fp16(amax / 127) overflows just above 65520 * 127
        block = g.standard_normal(n).astype(np.float32)
        block[g.integers(n)] = g.choice([-1, 1]) * g.uniform(8.30e6, 8.34e6)
        return block
    cases["Q8_0 amax near 8.3e6"] = blockwise(rng, 4, q8_boundary, size=32)
    return cases


def nonfinite_cases(rng) -> dict[str, np.ndarray]:
    x = rng.standard_normal((6, N)).astype(np.float32)
    for row, value in enumerate([np.inf, -np.inf, np.nan]):
        x[row, rng.integers(N, size=5)] = value
    x[3, :256] = np.nan
    x[4, :256] = np.inf
    x[5, 300:600] = -np.inf
    return {"inf/nan": x}


def assert_bytes_equal(ours, ref, label):
    assert ours.shape == ref.shape, label
    bad = np.argwhere(ours != ref)
    assert bad.size == 0, f"{label}: {len(bad)} bytes differ, first at (row, byte) {tuple(bad[0])}"


def assert_bits_equal(ours, ref, label):
    assert ours.shape == ref.shape, label
    bad = np.argwhere(ours.view(np.uint32) != ref.view(np.uint32))
    assert bad.size == 0, (f"{label}: {len(bad)} values differ, first at {tuple(bad[0])}: "
                           f"{ours[tuple(bad[0])]!r} vs {ref[tuple(bad[0])]!r}")


@pytest.mark.parametrize("qtype", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_edge_cases(ggml, qtype):
    for name, x in edge_cases(np.random.default_rng(7)).items():
        ref = ggml.quantize(qtype, x)
        assert_bytes_equal(quants.quantize(qtype, x), ref, f"{qtype.name} {name}")
        if qtype != T.F32:
            assert_bits_equal(quants.dequantize(qtype, ref), ggml.dequantize(qtype, ref, N),
                              f"{qtype.name} dequantize {name}")


@pytest.mark.parametrize("qtype", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_nonfinite(ggml, qtype):
    for name, x in nonfinite_cases(np.random.default_rng(8)).items():
        ref = ggml.quantize(qtype, x)
        if not np.array_equal(ref, ggml.quantize(qtype, x)):
            pytest.skip(f"ggml's {qtype.name} output for {name} input is not deterministic")
        assert_bytes_equal(quants.quantize(qtype, x), ref, f"{qtype.name} {name}")


@pytest.mark.parametrize("qtype", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_one_million_random_values(ggml, qtype):
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((1024, N)) * 10.0 ** rng.uniform(-6, 4, (1024, 1))).astype(np.float32)
    assert_bytes_equal(quants.quantize(qtype, x), ggml.quantize(qtype, x), qtype.name)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", QUANTIZE_TYPES, ids=lambda t: t.name)
def test_quantize_sweep(ggml, qtype):
    for seed in range(16):
        rng = np.random.default_rng(1000 + seed)
        x = (rng.standard_normal((1024, N)) * 10.0 ** rng.uniform(-30, 30, (1024, 1))).astype(np.float32)
        assert_bytes_equal(quants.quantize(qtype, x), ggml.quantize(qtype, x), f"{qtype.name} seed {seed}")
        for name, cases in edge_cases(rng).items():
            assert_bytes_equal(quants.quantize(qtype, cases), ggml.quantize(qtype, cases),
                               f"{qtype.name} {name} seed {seed}")


@pytest.mark.parametrize("qtype", DECODE_TYPES, ids=lambda t: t.name)
def test_dequantize_random_bytes(ggml, qtype):
    """Bit-identical wherever ggml's value is a number. Where it is NaN (a NaN or inf scale field)
    ours is NaN too, but the payload may differ: with two NaN operands x86 returns the first one,
    and LLVM may swap the operands of a commutative float add."""
    blck, tsize = GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(int(qtype)).integers(0, 256, (256, N // blck * tsize), dtype=np.uint8)
    ours, ref = quants.dequantize(qtype, data), ggml.dequantize(qtype, data, N)
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    numbers = ~np.isnan(ref)
    assert_bits_equal(ours[numbers], ref[numbers], qtype.name)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_every_half_decodes_like_ggml(ggml, qtype):
    halves = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(1, -1)
    assert_bits_equal(quants.dequantize(qtype, halves), ggml.dequantize(qtype, halves, 65536), qtype.name)


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_random_float_bits_encode_like_ggml(ggml, qtype):
    """Every class of float32: normals, subnormals, zeros, inf, quiet and signalling NaNs."""
    bits = np.random.default_rng(9).integers(0, 2**32, (256, N), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    assert_bytes_equal(quants.quantize(qtype, x), ggml.quantize(qtype, x), qtype.name)


def test_requantize_q8_0_to_q4_k_like_llama_quantize(ggml):
    """llama-quantize --allow-requantize: ggml_quantize_chunk(Q4_K, to_float(Q8_0 bytes))."""
    rng = np.random.default_rng(10)
    q8 = ggml.quantize(T.Q8_0, (rng.standard_normal((64, N)) * 0.02).astype(np.float32))
    expected = ggml.quantize(T.Q4_K, ggml.dequantize(T.Q8_0, q8, N))
    assert_bytes_equal(quants.requantize("q8_0", "q4_k", q8, chunk_values=5 * N), expected, "Q8_0->Q4_K")


CHECKED_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
                 T.MXFP4, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
                 T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.F16, T.BF16, T.F32, T.F64]


@pytest.mark.parametrize("qtype", CHECKED_TYPES, ids=lambda t: t.name)
def test_check_row_data_flags_what_ggml_rejects(ggml, qtype):
    """Random blocks with extra 0xFF bytes, each block checked by ggml_validate_row_data alone."""
    tsize = GGML_QUANT_SIZES[qtype][1]
    rng = np.random.default_rng(int(qtype))
    nblocks = max(300, 4096 // tsize)
    data = rng.integers(0, 256, (nblocks, tsize), dtype=np.uint8)
    data[rng.random(data.shape) < 0.02] = 0xFF
    expected_bad = [b for b in range(nblocks) if not ggml.validate_row_data(qtype, data[b])]
    check = quants.check_row_data(qtype, data)
    assert check == (len(expected_bad), expected_bad[0] if expected_bad else -1)
    assert 0 < len(expected_bad) < nblocks
    assert ggml.validate_row_data(qtype, data) == (check.n_bad == 0)
