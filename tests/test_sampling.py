"""runtime/sampling.py against libllama's own sampler chain (tests/llama_sampler.py), token for token, and its RNG
against the C++ standard's mt19937."""

import shutil
import subprocess

import numpy as np
import pytest

from ggtools.runtime.errors import SettingsError
from ggtools.runtime.sampling import MT19937, Sampler, SamplingParams, sampler_names

N_VOCAB = 2048


def _rows(seed, n, scale):
    """n rows of logits shaped like a language model's: a few strong candidates over a long tail. Their values are
    random float32, so two tokens share a logit with probability ~0 (llama.cpp leaves the order of ties open)."""
    rng = np.random.default_rng(seed)
    rows = []
    while len(rows) < n:
        row = rng.standard_normal(N_VOCAB).astype(np.float32) * np.float32(scale)
        row[rng.choice(N_VOCAB, 8, replace=False)] += np.float32(6.0)
        if np.unique(row).size == N_VOCAB:
            rows.append(row)
    return np.array(rows)


SETTINGS = {
    "default": SamplingParams(),
    "temp-0.6": SamplingParams(temp=0.6),
    "temp-1.5-top-k-0": SamplingParams(temp=1.5, top_k=0),
    "top-k-200": SamplingParams(top_k=200, top_p=0.9, min_p=0.0),
    "no-truncation": SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "top-p-only": SamplingParams(temp=1.0, top_k=0, top_p=0.8, min_p=0.0),
    "min-p-only": SamplingParams(temp=0.7, top_k=0, top_p=1.0, min_p=0.1),
    "min-keep": SamplingParams(top_k=0, top_p=0.5, min_p=0.3, min_keep=5),
    "typical": SamplingParams(typ_p=0.7),
    "top-n-sigma": SamplingParams(top_n_sigma=1.5, top_k=0),
    "penalties": SamplingParams(penalty_repeat=1.3, penalty_freq=0.2, penalty_present=0.4, penalty_last_n=16),
    "order": SamplingParams(samplers=("temperature", "min_p", "top_k", "top_p")),
    "suppress": SamplingParams(suppress=(0, 5, 17)),
}


@pytest.mark.oracle
@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 42, 4294967294])
def test_chain_equals_libllamas_sampler(name, seed):
    llama_cpp = pytest.importorskip("llama_cpp")
    from tests.llama_sampler import LlamaSampler
    params = SETTINGS[name].with_options(seed=seed)
    ours, theirs = Sampler(params, N_VOCAB), LlamaSampler(llama_cpp, params, N_VOCAB)
    rows = _rows(seed % 1000, 48, scale=2.0)
    history = np.random.default_rng(seed % 7).integers(0, N_VOCAB, 20)
    for t in history:                                  # the prompt, accepted into both chains (penalties)
        ours.accept(t)
        theirs.accept(t)
    got, want = [], []
    for row in rows:
        c = ours.distribution(row)
        got.append(ours.sample(row))
        ours.accept(got[-1])
        token, ids, probs = theirs.sample_with_candidates(row)
        want.append(token)
        # the chain's candidates in llama.cpp's order, and dist's probabilities bit for bit (float p / double sum)
        assert np.array_equal(c.ids, ids)
        assert np.array_equal((c.p.astype(np.float64) / ours.total(c)).astype(np.float32).view(np.int32),
                              probs.view(np.int32))
    assert got == want
    assert len(set(got)) > 1 or name == "temp-0", "the draws never differed: the test would not see a wrong RNG"


@pytest.mark.oracle
def test_a_one_candidate_chain_still_draws():
    """llama.cpp draws once even when the chain leaves one candidate, so the draws after it stay in step: rows with
    one dominant logit (top_p keeps one candidate) before rows where the draw decides."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tests.llama_sampler import LlamaSampler
    peaked = _rows(3, 12, scale=2.0)
    peaked[np.arange(12), np.arange(12)] += np.float32(100.0)
    rows = np.concatenate([peaked, _rows(4, 24, scale=2.0)])
    params = SamplingParams(seed=9)
    ours, theirs = Sampler(params, N_VOCAB), LlamaSampler(llama_cpp, params, N_VOCAB)
    got = []
    for row in rows:
        got.append(ours.sample(row))
        ours.accept(got[-1])
    assert got == [theirs.sample(r) for r in rows]
    assert got[:12] == list(range(12))


def test_mt19937_equals_the_standards_check_value():
    """C++11 [rand.predef]: the 10000th consecutive invocation of a default-constructed mt19937 (seed 5489)
    produces 4123659995."""
    rng = MT19937(5489)
    for _ in range(9999):
        rng.next_u32()
    assert rng.next_u32() == 4123659995


CANONICAL_CPP = r"""
#include <cstdio>
#include <random>
int main() {
    for (unsigned seed : {0u, 1u, 42u, 4294967294u}) {
        std::mt19937 rng(seed);
        std::uniform_real_distribution<double> dist(0.0f, 1.0f);
        for (int i = 0; i < 1000; i++) std::printf("%a\n", dist(rng));
    }
}
"""


def test_uniform_doubles_equal_the_cpp_library(tmp_path):
    """uniform_real_distribution<double> over mt19937, as llama.cpp's dist draws, against the C++ standard library
    on this machine (libstdc++: two 32-bit draws per double)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    src, exe = tmp_path / "canonical.cpp", tmp_path / "canonical"
    src.write_text(CANONICAL_CPP)
    subprocess.run([compiler, "-O2", "-o", str(exe), str(src)], check=True)
    want = [float.fromhex(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                                     check=True).stdout.split()]
    got = []
    for seed in (0, 1, 42, 4294967294):
        rng = MT19937(seed)
        got += [rng.canonical() for _ in range(1000)]
    assert got == want


def test_probabilities_are_the_draws_frequencies():
    """probabilities(row)[token] against the frequency of token over 20000 seeded draws: within 4.5 standard errors
    (a false alarm about 1 run in 150000)."""
    row = _rows(5, 1, scale=1.0)[0]
    params = SamplingParams(temp=0.9)
    probe = Sampler(params, N_VOCAB)
    c = probe.distribution(row)
    token = int(c.ids[1])
    p = probe.probabilities(row)[token]
    sampler = Sampler(params.with_options(seed=123), N_VOCAB)
    draws = 20000
    hits = sum(sampler.sample(row) == token for _ in range(draws))
    assert abs(hits / draws - p) <= 4.5 * np.sqrt(p * (1 - p) / draws)
    assert 0.01 < p < 0.99


def test_sampler_names_take_llamas_aliases():
    assert sampler_names("top-k;Nucleus;minp;temp;typ;penalties") == ("top_k", "top_p", "min_p", "temperature",
                                                                       "typ_p", "penalties")


@pytest.mark.parametrize("text, said", [("top_k;bogus", "unknown sampler 'bogus'"),
                                        ("infill", "not supported"), ("adaptive-p", "not supported")])
def test_sampler_names_refused(text, said):
    with pytest.raises(SettingsError, match=said):
        sampler_names(text)


@pytest.mark.parametrize("options, said", [
    ({"penalty_repeat": 0.0}, "penalty_repeat must be finite and greater than 0"),
    ({"penalty_repeat": 1e-39}, "penalty_repeat must be finite and greater than 0"),
    ({"temp": float("nan")}, "--temp: nan is not a finite 32-bit float"),
    ({"top_p": 1e300}, "--top-p: 1e[+]300 is not a finite 32-bit float"),
    ({"seed": 4294967295}, "--seed 4294967295: must lie in 0..4294967294"),
    ({"penalty_last_n": -1}, "--repeat-last-n -1")])
def test_settings_llama_cpp_refuses_are_refused(options, said):
    with pytest.raises(SettingsError, match=said):
        Sampler(SamplingParams().with_options(**options), N_VOCAB)
