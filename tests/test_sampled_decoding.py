"""Target-only sampled decoding against llama.cpp: libllama computes the logits (llama-cpp-python) and samples them
with its own chain (tests/llama_sampler.py, as common_sampler does: prompt accepted, one draw per token); the
runtime decodes with its Sampler. The tokens must be equal for every seed and temperature: the runtime's logits are
llama.cpp's bit for bit (the parity tests), and its chain and draws are libllama's (tests/test_sampling.py)."""

import pytest

from ggtools.runtime import TargetModel
from ggtools.runtime.greedy_decoding import greedy
from ggtools.runtime.sampling import Sampler, SamplingParams
from tests.llama_runner import LlamaCpp, avx2_llama_cpp
from tests.llama_sampler import LlamaSampler

pytestmark = pytest.mark.oracle

N = 24
DEMO_TARGET = "ggtools/data/demo/target.gguf"
SETTINGS = [SamplingParams(temp=0.6, seed=1), SamplingParams(temp=1.0, seed=7),
            SamplingParams(temp=0.8, seed=2024, top_k=0, top_p=0.9, min_p=0.0),
            SamplingParams(temp=1.0, seed=5, penalty_repeat=1.2, penalty_last_n=32)]


@pytest.fixture(scope="module")
def llama_cpp():
    return avx2_llama_cpp()


def llama_sampled(llama_cpp, path, prompt, n, params) -> list[int]:
    oracle = LlamaCpp(llama_cpp, path)
    llm = oracle.llm
    sampler = LlamaSampler(llama_cpp, params, llm.n_vocab())
    for token in prompt:
        sampler.accept(token)
    llm.reset()
    llm.eval(list(prompt))
    out = []
    while len(out) < n:
        out.append(sampler.sample(llm.scores[llm.n_tokens - 1]))
        llm.eval([out[-1]])
    return out


def assert_sampled_equal(llama_cpp, path, prompt, params, backend="numba"):
    model = TargetModel(path, threads=2, backend=backend)
    ours, _ = greedy(model, prompt, N, sampler=Sampler(params, model.hp.n_vocab))
    theirs = llama_sampled(llama_cpp, path, prompt, N, params)
    assert ours == theirs, f"{path} seed {params.seed} temp {params.temp}"
    assert len(set(ours)) > 3, "a near-greedy path would not show a wrong draw"


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temp}-s{p.seed}")
def test_demo_target(llama_cpp, params):
    assert_sampled_equal(llama_cpp, DEMO_TARGET, [1, 450, 996, 1354, 701], params)


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temp}-s{p.seed}")
def test_demo_target_torch(llama_cpp, params):
    """The torch backend (CPU, f32: its logits are numba's bit for bit) samples with the same chain."""
    pytest.importorskip("torch")
    assert_sampled_equal(llama_cpp, DEMO_TARGET, [1, 450, 996, 1354, 701], params, backend="torch")


@pytest.mark.slow
@pytest.mark.parametrize("params", SETTINGS[:2], ids=lambda p: f"T{p.temp}-s{p.seed}")
def test_smollm2(llama_cpp, smollm2_path, params):
    assert_sampled_equal(llama_cpp, smollm2_path, [1, 504, 3, 17, 9, 12], params)


ARCHS = [("tiny_target", "f32"), ("qwen3moe_target", "f16"), ("gpt_oss_target", "f16"), ("qwen35_target", "q8_0"),
         ("qwen35moe_target", "f16"), ("kimi_k3_target", "f16")]


@pytest.mark.slow
@pytest.mark.parametrize("fixture, encoding", ARCHS, ids=[a[0].removesuffix("_target") for a in ARCHS])
def test_tiny_targets_of_every_arch(llama_cpp, request, fixture, encoding):
    path = request.getfixturevalue(fixture).gguf[encoding]
    for params in SETTINGS[:2]:
        assert_sampled_equal(llama_cpp, path, [1, 20, 300, 40, 5], params)
