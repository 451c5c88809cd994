"""The runtime against its oracles: llama.cpp (llama-cpp-python, its default non-flash attention and
f16 KV cache) token for token and logit for logit, and transformers' hidden states for feature taps.

Logits are compared bit for bit: the runtime reproduces the float operations of llama.cpp's AVX2 CPU
kernels. That holds for llama.cpp builds whose CPU backend is the AVX2 one (the portable build of the
llama-cpp-python sdist, GGML_NATIVE=OFF); elsewhere the bit-exact tests skip.
"""

import numpy as np
import pytest

from ggtools.runtime import TargetModel, Tokenizer, greedy
from tests.float_reference import assert_within_reference_rounding, hf_hidden_states
from ggtools.runtime.model.ffn import dense
from ggtools.runtime.model.mixers import attention
from tests.llama_runner import (LlamaCpp, assert_one_call_steps_identical, assert_prompt_logits_identical,
                                avx2_llama_cpp)

pytestmark = pytest.mark.oracle

N_GREEDY = 64
TEXT_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Once upon a time,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
    "In 1905, Albert Einstein published",
    "Here is a list of fruits: apple, banana,",
]


@pytest.fixture(scope="module")
def llama_cpp():
    return avx2_llama_cpp()


@pytest.fixture(scope="module")
def smollm2_q8_0(smollm2_path, tmp_path_factory, llama_cpp):
    """SmolLM2 requantized to Q8_0 by llama.cpp's own quantizer (every matmul a Q8_0 one)."""
    from scripts.fixtures import llama_oracle
    out = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct.Q8_0.gguf"
    llama_oracle.quantize(smollm2_path, out, 7, allow_requantize=True)
    return out


@pytest.fixture(scope="module")
def smollm2_q4_0(smollm2_path, tmp_path_factory, llama_cpp):
    """SmolLM2 requantized to Q4_0 everywhere (pure: the tied embedding and output too) by llama.cpp's quantizer.
    Every matrix has a multiple of 8 rows, so llama.cpp's default loading repacks them all (CPU_REPACK, the 8x8
    gemv / gemm kernels); summed in the vec_dot order instead, the first prompt's logits were up to 1.87 off."""
    from scripts.fixtures import llama_oracle
    out = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct.Q4_0.gguf"
    llama_oracle.quantize(smollm2_path, out, 2, allow_requantize=True, pure=True)
    return out


@pytest.fixture(scope="module")
def smollm2_q4_k_m(smollm2_path, tmp_path_factory, llama_cpp):
    """SmolLM2 requantized to Q4_K_M by llama.cpp's quantizer: ffn_down Q4_K (16 layers, 576 rows: repacked, the
    q4_K 8x8 kernels) or Q6_K (14 layers), the 576-column matrices Q5_0 / Q8_0 (not a multiple of 256)."""
    from scripts.fixtures import llama_oracle
    out = tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct.Q4_K_M.gguf"
    llama_oracle.quantize(smollm2_path, out, 15, allow_requantize=True)
    return out


def test_k_quant_logits_are_bit_identical(smollm2_q4_k_m, llama_cpp):
    """Q4_K (repacked) and Q6_K on integers as llama.cpp sums them (kquant_dot.py): single tokens, prompts of 2-7
    tokens (gemv, the 4-row q4_K gemm, Q6_K's vec_dot) and of 8 or more (Q6_K through llama.cpp's tiled kernel)
    give llama.cpp's logits bit for bit. Before, as floats: 0.20-0.29 off on single tokens, 0.6-1.2 on prompts."""
    oracle, model = LlamaCpp(llama_cpp, smollm2_q4_k_m), TargetModel(smollm2_q4_k_m, threads=2)
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    prompts = [[t] for t in (1, 100, 2000, 9001)] + [[1, 100], [504, 3, 17, 9, 12]]
    assert_prompt_logits_identical(oracle, model, prompts + [tokenizer.encode(t) for t in TEXT_PROMPTS[:3]],
                                   "smollm2-q4_k_m")


@pytest.mark.parametrize("threads", [1, 2])
def test_k_quant_one_call_steps_are_bit_identical(smollm2_q4_k_m, llama_cpp, monkeypatch, threads):
    """The one-call paths take the integer K-quant plans too (matmul.plan_rows' K-quant family): every layer's dense
    FFN (Q5_0 gate and up, Q4_K or Q6_K down) is one call, and so is every layer's attention, also where Q, K and V
    are two plans (Q5_0 Q and K, Q8_0 V: matmul.group_rows); on 2 threads those calls share their matmuls with the
    worker."""
    oracle, model = LlamaCpp(llama_cpp, smollm2_q4_k_m), TargetModel(smollm2_q4_k_m, threads=threads)
    n_fused_attention = sum(layer.mixer.one_token is not None for layer in model.layers)
    assert n_fused_attention == len(model.layers)
    assert 0 < sum(len(layer.mixer.qkv.parts) > 1 for layer in model.layers) < len(model.layers)
    assert_one_call_steps_identical(monkeypatch, oracle, model, prompts_for("smollm2-q4_k_m", smollm2_q4_k_m, 1)[0], 6,
                                    [(attention, "one_token_attention", n_fused_attention),
                                     (dense, "one_token_ffn", len(model.layers))],
                                    f"smollm2-q4_k_m, {threads} thread(s)", shared=threads > 1)


@pytest.mark.slow
def test_k_quant_greedy_tokens_are_identical(smollm2_q4_k_m, llama_cpp):
    oracle, model = LlamaCpp(llama_cpp, smollm2_q4_k_m), TargetModel(smollm2_q4_k_m, threads=2)
    for ids in prompts_for("smollm2-q4_k_m", smollm2_q4_k_m, 3):
        model.kv.clear()
        assert greedy(model, ids, N_GREEDY)[0] == oracle.greedy(ids, N_GREEDY)


@pytest.fixture(scope="module")
def targets(smollm2_path, smollm2_q8_0, smollm2_q4_0, tiny_target):
    return {"smollm2-q4_1": smollm2_path, "smollm2-q8_0": smollm2_q8_0, "smollm2-q4_0": smollm2_q4_0,
            "tiny-qwen3-f32": tiny_target.gguf["f32"], "tiny-qwen3-f16": tiny_target.gguf["f16"]}


def prompts_for(name, path, count):
    if name.startswith("smollm2"):
        tokenizer = Tokenizer.from_gguf(TargetModel(path).weights.meta)
        return [tokenizer.encode(text) for text in TEXT_PROMPTS[:count]]
    rng = np.random.default_rng(7)
    return [[1] + rng.integers(3, 1024, 4 + 9 * k).tolist() for k in range(count)]


@pytest.mark.parametrize("name", ["smollm2-q4_1", "smollm2-q8_0", "smollm2-q4_0", "tiny-qwen3-f32", "tiny-qwen3-f16"])
def test_prompt_logits_are_bit_identical(targets, llama_cpp, name):
    path = targets[name]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=2)
    assert_prompt_logits_identical(oracle, model, prompts_for(name, path, 2), name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-q4_1", "smollm2-q8_0", "smollm2-q4_0", "tiny-qwen3-f32", "tiny-qwen3-f16"])
def test_greedy_tokens_are_identical(targets, llama_cpp, name):
    path = targets[name]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=2)
    for ids in prompts_for(name, path, 4 if name.startswith("smollm2") else 3):
        model.kv.clear()
        ours, _ = greedy(model, ids, N_GREEDY)
        assert ours == oracle.greedy(ids, N_GREEDY)


@pytest.mark.parametrize("name, threads", [(name, 1) for name in ["smollm2-q4_1", "smollm2-q8_0", "smollm2-q4_0",
                                                                     "tiny-qwen3-f32", "tiny-qwen3-f16"]]
                         + [("smollm2-q4_1", 2), ("smollm2-q8_0", 2)])
def test_one_call_steps_are_bit_identical(targets, llama_cpp, monkeypatch, name, threads):
    """A one-token step's attention and dense FFN, each with the layer's norm before it and the residual after it,
    run as one kernel call each (attention.one_token_attention, dense.one_token_ffn); on 2 threads SmolLM2's FFN
    matmuls (576 x 1536, over workers.ONE_CALL_MIN_WORK) are shared with the worker from inside those calls."""
    path = targets[name]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=threads)
    n_layer = len(model.layers)
    assert_one_call_steps_identical(monkeypatch, oracle, model, prompts_for(name, path, 1)[0], 6,
                                    [(attention, "one_token_attention", n_layer), (dense, "one_token_ffn", n_layer)],
                                    f"{name}, {threads} thread(s)", shared=threads > 1)


def test_f32_kv_cache_matches_llama_cpp(targets, llama_cpp):
    path = targets["tiny-qwen3-f32"]
    f32 = 0  # GGML_TYPE_F32
    oracle, model = LlamaCpp(llama_cpp, path, type_k=f32, type_v=f32), TargetModel(path, kv_type="f32")
    ids = prompts_for("tiny-qwen3-f32", path, 1)[0]
    ours, _ = model.forward(ids)
    assert np.array_equal(ours, oracle.prompt_logits(ids))
    assert greedy(model, [ids[-1]], 16)[0] == oracle.greedy(ids + [ids[-1]], 16)


@pytest.mark.parametrize("name", ["smollm2-q4_1", "tiny-qwen3-f16"])
def test_tokenizer_matches_llama_cpp(targets, llama_cpp, name):
    path = targets[name]
    oracle = LlamaCpp(llama_cpp, path).llm
    tokenizer = Tokenizer.from_gguf(TargetModel(path).weights.meta)
    for text in TEXT_PROMPTS + ["  spaces  and\ttabs\n\nnewlines 12345 ünïcödé 🦙"]:
        assert tokenizer.encode(text) == oracle.tokenize(text.encode(), add_bos=tokenizer.add_bos, special=True)


@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_feature_taps_equal_transformers_hidden_states(tiny_target, kind):
    """hidden_states[j] is the residual entering layer j (the last one is the final normed state). An f32 GGUF
    with an f32 cache: float32 rounding only, no further from transformers' float64 run than its own float32 run
    allows (float_reference.py). The f16 GGUF with llama.cpp's f16 cache also rounds, as llama.cpp does, each
    f16 matmul's input and q, k, v and the attention probabilities to f16 (seven roundings per layer, each off
    by up to 2^-12 relative): measured against transformers' float64 run they move the stream by up to 1.3e-3
    relative after 8 layers. Those roundings are llama.cpp's, which numba reproduces bit for bit on any CPU,
    and the float64 reference hardly depends on the machine: the bound is that measurement with room, 3e-3."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ids = [1] + np.random.default_rng(1).integers(3, 1024, 30).tolist()
    hidden = hf_hidden_states(tiny_target.hf_dir, ids)
    model = TargetModel(tiny_target.gguf[kind], kv_type=kind)
    taps = list(range(model.hp.n_layer + 1))
    _, features = model.forward(ids, taps=taps, logits="none")
    for j in taps:
        if kind == "f32":
            assert_within_reference_rounding(features[:, j], hidden["f32"][j], hidden["f64"][j], f"tap {j}")
        else:
            assert np.abs(features[:, j] - hidden["f64"][j]).max() <= 3e-3 * np.abs(hidden["f64"][j]).max(), j
