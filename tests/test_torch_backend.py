"""The torch backend's pieces and its selection: DeviceMatrix products in float32 against numba's matmul kernels
(which are llama.cpp's CPU numerics) for every weight type and every summation layout llama.cpp picks, bit for
bit; ggml's float functions in torch against numba's; and --backend / --device / --dtype on the command line and
in the library (one line naming the extra when torch is missing, exit 2 for what cannot run)."""

import json
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from ggtools import quants
from ggtools.cli import main
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import demo_data, held_out_prompts
from ggtools.jobs.run import run_speculative
from ggtools.runtime import ModelError, TargetModel, Tokenizer
from ggtools.runtime.backends import make_ops
from ggtools.runtime.weights import Matrix, MatrixGroup

torch = pytest.importorskip("torch")
from ggtools.runtime.torch_backend.matrix import DeviceMatrix  # noqa: E402

TARGET = str(demo_data() / "target.gguf")
TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.MXFP4]


def weights_of(qtype, n_rows=48, n_cols=512, n_expert=1) -> np.ndarray:
    w = np.random.default_rng(int(qtype)).standard_normal((n_expert * n_rows, n_cols)).astype(np.float32) * 0.1
    if qtype == T.MXFP4:
        import gguf
        return gguf.quants.quantize(w, T.MXFP4).view(np.uint8).reshape(n_expert * n_rows, -1)
    return quants.quantize(qtype, w)


def matrix_pair(qtype, n_rows, n_cols, n_expert=1):
    """The same weights as numba's Matrix and as a float32 DeviceMatrix."""
    buf = np.ascontiguousarray(weights_of(qtype, n_rows, n_cols, n_expert)).reshape(-1)
    return (Matrix("w", qtype, n_rows, n_cols, buf, n_expert=n_expert),
            DeviceMatrix.from_buffer("w", qtype, n_rows, n_cols, buf, 0, n_expert, device=torch.device("cpu"),
                                     dtype=torch.float32))


def shapes_of(qtype) -> list[tuple[int, int]]:
    """(rows, columns) that take each of llama.cpp's layouts for the type: rows a multiple of 8 (Q4_0 and MXFP4
    repacked) or not and not of 4 (no tinyBLAS: every row dotted alone); an odd number of blocks (MXFP4's last
    block outside its pairs); float rows with a remainder past the steps of 32 and of 8 (vec_dot's leftover
    loop, f16's float64 one)."""
    qk = GGML_QUANT_SIZES[qtype][0]
    if qk == 256:
        return [(48, 512), (45, 256)]
    if qk == 32:
        return [(48, 512), (45, 480)]
    return [(48, 512), (45, 520), (44, 516)]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matrix_product_equals_numba(qtype):
    """Same input, same weights: a float32 DeviceMatrix gives numba's bits (llama.cpp's roundings and summation
    orders) for a batch (5 rows; 9: K-quants' tiled kernel), one row, a stepwise batch, and an expert's rows of a
    stack (4 rows; 9)."""
    rng = np.random.default_rng(1)
    for n_rows, n_cols in shapes_of(qtype):
        numba_matrix, device_matrix = matrix_pair(qtype, n_rows, n_cols)
        x = rng.standard_normal((9, n_cols)).astype(np.float32)
        for rows, stepwise in ((x[:5], False), (x, False), (x[:1], False), (x[:5], True)):
            want = numba_matrix(rows, stepwise)
            got = device_matrix(torch.from_numpy(rows), stepwise).numpy()
            assert np.array_equal(got, want), (n_rows, n_cols, len(rows), stepwise)
        assert np.array_equal(device_matrix.rows([3, 0]).numpy(), numba_matrix.rows([3, 0]))
    numba_stack, device_stack = matrix_pair(qtype, 16, shapes_of(qtype)[0][1], n_expert=3)
    x = rng.standard_normal((12, device_stack.n_cols)).astype(np.float32)
    (want,) = MatrixGroup(numba_stack).run_experts(x, None, np.array([0, 2]), np.array([0, 3, 12]))
    got = torch.cat([device_stack.product(torch.from_numpy(x[:3]), 0),
                     device_stack.product(torch.from_numpy(x[3:12]), 2)])
    assert np.array_equal(got.numpy(), want)


def test_ggml_functions_equal_numba():
    """ggml's vector expf, libm's expf / logf (glibc's), SiLU with its leftovers, sigmoid, softmax with a sink and
    rms_norm, in torch on the CPU, against the numba runtime's (the same bits): the device check's comparison
    (scripts/bench/device_check.py), on inputs over their ranges, infinities, NaN and zeros included."""
    from scripts.bench.device_check import functions_on_device
    assert functions_on_device(torch, "cpu") == []


def test_matrix_keeps_the_file_bytes_on_the_cpu():
    """On the CPU the blocks are the mapped file's own memory: no copy."""
    model = TargetModel(TARGET, backend="torch", threads=1)
    m = model.layers[0].ffn.gate
    assert m.blocks.dtype == torch.uint8
    mapped = model.weights._buffer(model.weights.meta)
    assert m.blocks.data_ptr() - mapped.ctypes.data == model.weights._lookup(m.name)[1].data_start


def test_make_ops_refuses_what_cannot_run():
    for args, words in [(("numba", "cuda"), "need --backend torch"), (("numba", None, "bf16"), "need --backend torch"),
                        (("torch", "tpu"), "expected cpu, cuda or cuda:N"),
                        (("torch", "cpu", "f8"), "expected one of"), (("jax",), "unknown backend")]:
        with pytest.raises(ModelError, match=words):
            make_ops(*args)
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="sees no CUDA device"):
            make_ops("torch", "cuda:0")


def test_run_on_torch_reports_its_backend():
    r = CliRunner().invoke(main, ["run", "--target", TARGET, "--prompt", "def main():", "-n", "8", "--backend", "torch",
                                  "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["backend"], out["device"], out["dtype"]) == ("torch", "cpu", "f32")
    numba = CliRunner().invoke(main, ["run", "--target", TARGET, "--prompt", "def main():", "-n", "8", "--json"])
    assert json.loads(numba.stdout)["backend"] == "numba"


def test_bf16_reports_that_it_is_not_llama_cpp_arithmetic():
    """bf16 / f16 multiply in that dtype and round nothing as llama.cpp does: the run report says so (f32's does
    not need to)."""
    for dtype, says in (("bf16", True), ("f32", False)):
        r = CliRunner().invoke(main, ["run", "--target", TARGET, "--prompt", "def main():", "-n", "4", "--backend",
                                      "torch", "--dtype", dtype, "--threads", "1"])
        assert r.exit_code == 0, r.output
        assert (f"({dtype}; {dtype} is not llama.cpp's arithmetic" in r.output) == says, r.output


@pytest.mark.parametrize("args, words", [
    (["--backend", "torch", "--device", "cuda:7"], "--device cuda:7"),
    (["--device", "cuda"], "need --backend torch"),
    (["--backend", "torch", "--device", "gpu"], "expected cpu, cuda or cuda:N"),
])
def test_bad_backend_options_are_one_line(args, words):
    if "cuda:7" in args and torch.cuda.device_count() > 7:
        pytest.skip("this machine has 8 CUDA devices")
    r = CliRunner().invoke(main, ["run", "--target", TARGET, "--prompt", "x", *args])
    assert r.exit_code == 2
    assert words in r.output and len(r.output.strip().splitlines()) == 1


def test_missing_torch_names_the_extra():
    """A Python where `import torch` fails: one line naming the extra, exit 2, for run, accept and demo."""
    block = "import sys; sys.modules['torch'] = None; from ggtools.cli import main; main()"
    for command in (["run", "--target", TARGET, "--prompt", "x"],
                    ["accept", "--target", TARGET, "--draft", TARGET],
                    ["demo", "--skip-requant"]):
        p = subprocess.run([sys.executable, "-c", block, *command, "--backend", "torch"], capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 2, (command, p.stderr)
        assert p.stderr.strip() == "error: --backend torch needs torch, an optional extra: pip install 'ggtools[torch]'"


def test_bf16_runs_the_gpu_code_path_on_the_cpu():
    """bf16 compute (the GPU default) on the CPU: the demo pair's speculative output equals its own greedy
    decoding, and the drafter stays useful (tau above 1.5)."""
    model = TargetModel(TARGET, backend="torch", dtype="bf16", threads=1)
    assert model.layers[0].ffn.gate.product(torch.ones((1, 128))).dtype == torch.bfloat16
    ids = [p for _, p in held_out_prompts(Tokenizer.from_gguf(model.weights.meta), 2)]
    with tempfile.TemporaryDirectory() as tmp:
        convert_dflash(demo_data() / "drafter", f"{tmp}/d.gguf", profile="llama.cpp", target=TARGET, outtype="f16")
        run = run_speculative(model, f"{tmp}/d.gguf", ids, 32)
    assert run.outputs_match_target and run.dtype == "bf16"
    assert run.stats["tau_zlab"] > 1.5


def test_device_check_without_cuda_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: scripts/device_check.sh runs there")
    p = subprocess.run(["bash", "scripts/device_check.sh"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert p.stderr.strip().startswith("device_check: no CUDA device") and len(p.stderr.strip().splitlines()) == 1
