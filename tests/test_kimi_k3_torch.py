"""The tiny Kimi K3 target on the torch backend in float32 (CPU) against the numba runtime, which is llama.cpp's
CPU numerics bit for bit on it (test_kimi_k3_parity): torch in float32 performs numba's operations in numba's
order (KDA's per-channel decay, MLA's unrepacked per-head matrices over the latent cache, situ with glibc's tanhf,
sigmoid routing, the residual attention's fma chain), so prompt logits (a batch and one-token steps), greedy
tokens and their logits, the KDA states' crop and speculative decoding are equal bit for bit, in every encoding."""

import numpy as np
import pytest

from ggtools.runtime import Drafter, TargetModel, greedy, speculative_generate
from tests.backend_parity import logit_parity, random_prompt
from tests.llama_runner import greedy_logits

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.oracle

ENCODINGS = ["f32", "f16", "q8_0", "plain-f32"]
N_GREEDY = 32


def pair(kimi_k3_target, encoding, kv_type="f16"):
    path = kimi_k3_target.gguf[encoding]
    return TargetModel(path, threads=2, kv_type=kv_type), TargetModel(path, backend="torch", threads=1,
                                                                      kv_type=kv_type)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("kv_type", ["f16", "f32"])
def test_prompt_logits_equal_numba(kimi_k3_target, encoding, kv_type):
    numba, on_torch = pair(kimi_k3_target, encoding, kv_type)
    p = logit_parity(numba, on_torch, random_prompt(numba, 7, 24))
    assert p.equal, p


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_greedy_equals_numba(kimi_k3_target, encoding):
    numba, on_torch = pair(kimi_k3_target, encoding)
    for seed in (37, 56):
        ids = random_prompt(numba, seed, 16)
        want, want_rows = greedy_logits(numba, ids, N_GREEDY, prompt_logits="last")
        got, rows = greedy_logits(on_torch, ids, N_GREEDY, prompt_logits="last")
        assert got == want and np.array_equal(rows, want_rows)


def test_kda_crop_on_torch_is_bit_identical(kimi_k3_target):
    model = TargetModel(kimi_k3_target.gguf["f16"], backend="torch", threads=1)
    ids = random_prompt(model, 3, 20)
    model.forward(ids + [5, 6, 7, 8])
    model.kv.crop(len(ids) + 1)
    after_crop, _ = model.forward([9, 10])
    model.kv.clear()
    model.forward(ids + [5])
    fresh, _ = model.forward([9, 10])
    assert np.array_equal(after_crop, fresh)


@pytest.mark.parametrize("encoding, ring_cap", [("f16", 8), ("q8_0", None)])
def test_speculative_equals_greedy_and_numba_on_torch(kimi_k3_target, kimi_k3_drafters, encoding, ring_cap):
    numba, on_torch = pair(kimi_k3_target, encoding)
    ids = random_prompt(numba, 5, 16)
    outs = []
    for model in (numba, on_torch):
        drafter = Drafter(kimi_k3_drafters["refs"]["v2"], model)
        model.kv.clear()
        want = greedy(model, ids, 32)[0]
        model.kv.clear()
        out = speculative_generate(model, drafter, drafter.new_kv(ring_cap), ids, 32)
        assert out.tokens == want
        outs.append(out.steps)
    assert outs[0] == outs[1]


def test_tanhf_is_glibcs():
    """libm_tanhf against libm's tanhf itself (numba's np.tanh on float32 calls it, as ggml's tanh op does): every
    value equal, over random values of every magnitude and random bit patterns below 22 and above."""
    from numba import njit

    from ggtools.runtime.torch_backend.libm_tanhf import tanhf

    @njit(error_model="numpy")
    def libm(x, out):
        for i in range(x.size):
            out[i] = np.tanh(x[i])

    rng = np.random.default_rng(0)
    x = np.concatenate([(rng.standard_normal(200_000) * s).astype(np.float32) for s in (1e-4, 0.1, 1, 4, 30)] +
                       [rng.integers(0, 0x42000000, 500_000, dtype=np.uint32).view(np.float32)])
    x = np.concatenate([x, -x, np.float32([0.0, -0.0, 22.0, 1.0, -1.0, np.inf, -np.inf])])
    want = np.empty_like(x)
    libm(x, want)
    assert np.array_equal(tanhf(torch.from_numpy(x)).numpy().view(np.uint32), want.view(np.uint32))
