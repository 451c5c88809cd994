"""The Gated DeltaNet mixer against transformers' Qwen3_5GatedDeltaNet (float32 torch, the independent
reference), fed in chunks so the conv and delta-rule state carry over; rollback of the recurrent state
(HybridCache.crop) against never having gone further."""

import copy

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from ggtools.runtime.model.mixers.gated_delta_net import GatedDeltaNet
from ggtools.runtime.model.hybrid_cache import HybridCache, RecurrentState
from ggtools.runtime.weights import Matrix
from tests.float_reference import assert_within_reference_rounding

EMBD, K_HEADS, V_HEADS, HEAD_DIM, KERNEL, EPS = 64, 2, 4, 32, 4, 1e-6


def f32_matrix(name, w):
    w = np.ascontiguousarray(w, np.float32)
    return Matrix(name, T.F32, w.shape[0], w.shape[1], np.frombuffer(w.tobytes(), np.uint8))


def tiled(n_k_heads, n_v_heads, head_dim):
    """Row order of v heads in llama.cpp's GGUFs: HF groups v heads by k head, the converter tiles them
    (v head j of k head g moves from g * r + j to j * n_k_heads + g)."""
    r = n_v_heads // n_k_heads
    return np.arange(n_v_heads * head_dim).reshape(n_k_heads, r, head_dim).transpose(1, 0, 2).reshape(-1)


@pytest.fixture(scope="module")
def reference():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    config = transformers.Qwen3_5TextConfig(
        hidden_size=EMBD, linear_num_key_heads=K_HEADS, linear_num_value_heads=V_HEADS,
        linear_key_head_dim=HEAD_DIM, linear_value_head_dim=HEAD_DIM, linear_conv_kernel_dim=KERNEL,
        rms_norm_eps=EPS, num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(0)
    module = Qwen3_5GatedDeltaNet(config, 0).float().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
        module.norm.weight.add_(1.0)
        module.A_log.copy_(torch.log(torch.rand(V_HEADS) * 4 + 0.5))
    return torch, module


def ours_from(module) -> GatedDeltaNet:
    """The mixer with the module's weights laid out as llama.cpp's converter writes them."""
    sd = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    key_dim = K_HEADS * HEAD_DIM
    v_rows = tiled(K_HEADS, V_HEADS, HEAD_DIM)
    heads = tiled(K_HEADS, V_HEADS, 1)
    qkv = sd["in_proj_qkv.weight"]
    qkv = np.concatenate([qkv[:2 * key_dim], qkv[2 * key_dim:][v_rows]])
    conv = sd["conv1d.weight"].squeeze(1)
    conv = np.concatenate([conv[:2 * key_dim], conv[2 * key_dim:][v_rows]])
    return GatedDeltaNet(
        wqkv=f32_matrix("qkv", qkv), wgate=f32_matrix("z", sd["in_proj_z.weight"][v_rows]),
        wbeta=f32_matrix("beta", sd["in_proj_b.weight"][heads]),
        walpha=f32_matrix("alpha", sd["in_proj_a.weight"][heads]),
        conv=np.ascontiguousarray(conv.T, np.float32), dt_bias=sd["dt_bias"][heads].astype(np.float32),
        a=(-np.exp(sd["A_log"][heads])).astype(np.float32), norm=sd["norm.weight"].astype(np.float32),
        wout=f32_matrix("out", sd["out_proj.weight"][:, v_rows]), n_k_heads=K_HEADS, head_dim=HEAD_DIM, eps=EPS)


def run_chunks(mixer, state, x, sizes):
    out, at = [], 0
    for n in sizes:
        out.append(mixer.mix(x[at:at + n], state, stepwise=False))
        at += n
    return np.concatenate(out)


@pytest.mark.parametrize("sizes", [[23], [9, 1, 1, 5, 7], [1] * 23])
def test_mixer_matches_transformers(reference, sizes):
    """float32 rounding only: no further from the module's float64 run than its own float32 run allows
    (float_reference.py)."""
    torch, module = reference
    x = np.random.default_rng(1).standard_normal((sum(sizes), EMBD)).astype(np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)[None])[0].numpy()
        want64 = copy.deepcopy(module).double()(torch.from_numpy(x).double()[None])[0].numpy()
    mixer = ours_from(module)
    got = run_chunks(mixer, RecurrentState(mixer), x, sizes)
    assert_within_reference_rounding(got, want, want64, f"chunks {sizes}")


def test_chunking_does_not_change_a_bit(reference):
    """The recurrence is per token and a row's product does not depend on the rows beside it within one layout
    (tinyBLAS for batches, vec_dot's for one row or stepwise): chunks of 2+ rows give the whole batch's bits,
    one-row steps give the stepwise batch's."""
    _, module = reference
    mixer = ours_from(module)
    x = np.random.default_rng(2).standard_normal((12, EMBD)).astype(np.float32)
    whole = run_chunks(mixer, RecurrentState(mixer), x, [12])
    assert np.array_equal(whole, run_chunks(mixer, RecurrentState(mixer), x, [5, 2, 5]))
    steps = np.concatenate([mixer.mix(x[i:i + 1], state, stepwise=True)
                            for state in [RecurrentState(mixer)] for i in range(12)])
    stepwise = mixer.mix(x, RecurrentState(mixer), stepwise=True)
    assert np.array_equal(steps, stepwise)


def hybrid_cache(mixer, window):
    return HybridCache(0, 1, HEAD_DIM, [RecurrentState(mixer)], window=window)


@pytest.mark.parametrize("crop_to", [0, 3, 10, 14])
def test_crop_restores_the_recurrent_state(reference, crop_to):
    _, module = reference
    mixer = ours_from(module)
    x = np.random.default_rng(3).standard_normal((20, EMBD)).astype(np.float32)
    cache = hybrid_cache(mixer, window=16)
    for at, n in ((0, 10), (10, 4), (14, 1)):       # the checkpoint stays at 0: 15 positions fit the window
        cache.reserve(at + n)
        mixer.mix(x[at:at + n], cache.recurrent[0], stepwise=True)
        cache.n_tokens = at + n
    cache.crop(crop_to)
    cache.reserve(20)
    after_crop = mixer.mix(x[crop_to:20], cache.recurrent[0], stepwise=True)
    fresh = hybrid_cache(mixer, window=16)
    fresh.reserve(crop_to)
    if crop_to:
        mixer.mix(x[:crop_to], fresh.recurrent[0], stepwise=True)
    fresh.n_tokens = crop_to
    never_further = mixer.mix(x[crop_to:20], fresh.recurrent[0], stepwise=True)
    assert np.array_equal(after_crop, never_further)
    assert np.array_equal(cache.recurrent[0].ssm, fresh.recurrent[0].ssm)
    assert np.array_equal(cache.recurrent[0].conv, fresh.recurrent[0].conv)


def test_crop_before_the_checkpoint_is_refused(reference):
    _, module = reference
    mixer = ours_from(module)
    x = np.random.default_rng(4).standard_normal((12, EMBD)).astype(np.float32)
    cache = hybrid_cache(mixer, window=8)
    for at, n in ((0, 6), (6, 6)):                   # 12 > 8: the second batch moves the checkpoint to 6
        cache.reserve(at + n)
        mixer.mix(x[at:at + n], cache.recurrent[0], stepwise=True)
        cache.n_tokens = at + n
    assert cache.base == 6
    with pytest.raises(ValueError, match="rolls back only to position 6"):
        cache.crop(5)
    cache.crop(7)
    assert cache.n_tokens == 7
