"""The torch backend's dequantizers against ggtools.quants.dequantize (itself bit-exact with ggml): bit for bit on
every type the runtime runs, on data made by ggtools' quantizers, by llama.cpp's quantizer (the oracle fixtures'
llama-quantize outputs), on random bytes, and on every f16 / bf16 bit pattern."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ggtools import quants
from ggtools.gguf import ShardSet
from tests.oracle_artifacts import qwen35moe_set, ref_drafter_quant  # noqa: F401  (fixtures)
from tests.test_quants import assert_same_floats, sample_rows

torch = pytest.importorskip("torch")
from ggtools.runtime.torch_backend.dequant import SUPPORTED_TYPES, dequantize  # noqa: E402

RUNTIME_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                 T.Q6_K, T.MXFP4]
QUANTIZABLE = [t for t in RUNTIME_TYPES if t != T.MXFP4]


def torch_dequantize(qtype, data: np.ndarray, n_cols: int) -> np.ndarray:
    rows = torch.from_numpy(np.ascontiguousarray(data).reshape(-1, quants.row_bytes(qtype, n_cols)))
    return dequantize(qtype, rows, n_cols).numpy()


def test_every_runtime_type_has_a_decoder():
    from ggtools.runtime.kernels.matmul import SUPPORTED_TYPES as NUMBA_TYPES
    assert SUPPORTED_TYPES == set(RUNTIME_TYPES) == NUMBA_TYPES


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_data_quantized_by_ggtools(qtype):
    x = sample_rows(np.random.default_rng(5))
    data = quants.quantize(qtype, x)
    assert_same_floats(torch_dequantize(qtype, data, x.shape[1]), quants.dequantize(qtype, data))


def test_mxfp4_quantized_by_gguf_py():
    import gguf
    x = sample_rows(np.random.default_rng(6))
    data = gguf.quants.quantize(x, T.MXFP4)
    assert_same_floats(torch_dequantize(T.MXFP4, data, x.shape[1]), quants.dequantize(T.MXFP4, data))


@pytest.mark.parametrize("qtype", RUNTIME_TYPES, ids=lambda t: t.name)
def test_random_bytes(qtype):
    """Every bit pattern a block can hold: NaN and inf scales, all-ones nibbles, extreme E8M0 exponents."""
    blck, tsize = GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(int(qtype)).integers(0, 256, (64, 1024 // blck * tsize), dtype=np.uint8)
    assert_same_floats(torch_dequantize(qtype, data, 1024), quants.dequantize(qtype, data, 1024))


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_every_half_bit_pattern(qtype):
    data = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(64, -1)
    ours, ref = torch_dequantize(qtype, data, 1024), quants.dequantize(qtype, data, 1024)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))   # NaN payloads included


def tensors_of(path):
    with ShardSet(path) as shards:
        for f in shards.files:
            for t in f.tensors:
                yield T(t.type_id), t.name, np.array(f.tensor_data(t)), t.row_length


def assert_file_decodes(path, seen: set):
    for qtype, name, data, n_cols in tensors_of(path):
        if qtype not in SUPPORTED_TYPES:
            continue
        seen.add(qtype)
        ours = torch_dequantize(qtype, data, n_cols)
        ref = quants.dequantize(qtype, data, n_cols)
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), f"{path.name}: {name} ({qtype.name})"


@pytest.mark.oracle
def test_llama_quantize_outputs(ref_drafter_quant, qwen35moe_set):
    """Every tensor of llama-quantize's Q8_0, Q4_K_M and Q2_K drafters and of the MXFP4_MOE and surgical (Q4_K)
    qwen35moe files."""
    seen = set()
    for version in (1, 2):
        for ftype in ("Q8_0", "Q4_K_M", "Q2_K"):
            assert_file_decodes(ref_drafter_quant(version, ftype), seen)
    assert_file_decodes(qwen35moe_set.mxfp4_moe, seen)
    assert_file_decodes(qwen35moe_set.surgical, seen)
    assert seen >= {T.F32, T.F16, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q6_K, T.MXFP4}


def test_rows_of_several_blocks_keep_their_order():
    """Rows of 3 K-blocks read as (rows, row_bytes): the reshape to blocks and back keeps rows apart."""
    x = np.random.default_rng(9).standard_normal((5, 768)).astype(np.float32)
    data = quants.quantize(T.Q4_K, x)
    assert torch_dequantize(T.Q4_K, data, 768).shape == (5, 768)
    assert_same_floats(torch_dequantize(T.Q4_K, data, 768), quants.dequantize(T.Q4_K, data))
