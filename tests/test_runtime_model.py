"""TargetModel on tiny random GGUFs written here: math against a float64 numpy transformer, feature taps,
KV-cache rollback, batch/step equivalence, input validation."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from ggtools import quants
from ggtools.runtime import ModelError, TargetModel, greedy
from tests.float_reference import assert_within_reference_rounding

VOCAB, EMBD, FF, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 96, 64, 128, 4, 2, 16, 2


def write_model(path, arch="llama", qtype=T.F32, tied=True, seed=0, split_max_tensors=0):
    """A 2-layer model with random weights; qwen3 adds per-head q/k norms. With split_max_tensors the
    model is written as shards <stem>-0000i-of-0000n.gguf."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(EMBD)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)

    def matrix(name, n_out, n_in, scale=0.3):
        x = (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32)
        if qtype == T.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, quants.quantize(qtype, x), raw_dtype=qtype)

    def vector(name, n):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", VOCAB, EMBD, 1.0)
    for i in range(LAYERS):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", EMBD)
        matrix(p + "attn_q.weight", HEADS * HEAD_DIM, EMBD)
        matrix(p + "attn_k.weight", KV_HEADS * HEAD_DIM, EMBD)
        matrix(p + "attn_v.weight", KV_HEADS * HEAD_DIM, EMBD)
        matrix(p + "attn_output.weight", EMBD, HEADS * HEAD_DIM)
        if arch == "qwen3":
            vector(p + "attn_q_norm.weight", HEAD_DIM)
            vector(p + "attn_k_norm.weight", HEAD_DIM)
        vector(p + "ffn_norm.weight", EMBD)
        matrix(p + "ffn_gate.weight", FF, EMBD)
        matrix(p + "ffn_up.weight", FF, EMBD)
        matrix(p + "ffn_down.weight", EMBD, FF)
    vector("output_norm.weight", EMBD)
    if not tied:
        matrix("output.weight", VOCAB, EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {
        "llama-f32": write_model(d / "llama-f32.gguf"),
        "qwen3-f32": write_model(d / "qwen3-f32.gguf", arch="qwen3", tied=False, seed=1),
        "llama-q8_0": write_model(d / "llama-q8_0.gguf", qtype=T.Q8_0, seed=2),
        "qwen3-q4_1": write_model(d / "qwen3-q4_1.gguf", arch="qwen3", qtype=T.Q4_1, tied=False, seed=3),
        "llama-f16": write_model(d / "llama-f16.gguf", qtype=T.F16, seed=4),
    }


def reference_forward(model: TargetModel, tokens, dtype=np.float64, f16_cache: bool = False):
    """Plain transformer in numpy (float64, or float32 to measure float32's rounding) with the arch's RoPE
    pairing; f16_cache: q, k, v and the attention probabilities rounded to f16 as llama.cpp rounds them over an
    f16 cache. Returns (logits, the hidden states entering each layer plus the final normed state)."""
    hp = model.hp

    def deq(m):
        return quants.dequantize(m.qtype, m.data, m.n_cols).reshape(m.n_rows, m.n_cols).astype(dtype)

    def f16(v):
        return v.astype(np.float16).astype(dtype) if f16_cache else v

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + hp.rms_eps) * w

    n = len(tokens)
    x = deq(model.token_embd)[tokens]
    angles = np.arange(n)[:, None] * hp.rope_base ** (-np.arange(0, hp.rope_dims, 2) / hp.rope_dims)
    cos, sin = np.cos(angles).astype(dtype)[:, None], np.sin(angles).astype(dtype)[:, None]

    def rope(v):
        out, d = v.copy(), hp.rope_dims
        a, b = (v[..., :d // 2], v[..., d // 2:d]) if hp.rope_neox else (v[..., 0:d:2], v[..., 1:d:2])
        ra, rb = a * cos - b * sin, a * sin + b * cos
        if hp.rope_neox:
            out[..., :d // 2], out[..., d // 2:d] = ra, rb
        else:
            out[..., 0:d:2], out[..., 1:d:2] = ra, rb
        return out

    hidden = []
    for layer in model.layers:
        hidden.append(x)
        a = layer.mixer
        h = rms(x, layer.attn_norm)
        q = (h @ deq(a.wq).T).reshape(n, hp.n_head, hp.head_dim)
        k = (h @ deq(a.wk).T).reshape(n, hp.n_head_kv, hp.head_dim)
        v = (h @ deq(a.wv).T).reshape(n, hp.n_head_kv, hp.head_dim)
        if a.q_norm.size:
            q, k = rms(q, a.q_norm), rms(k, a.k_norm)
        q, k, v = f16(rope(q)), f16(rope(k)), f16(v)
        k, v = np.repeat(k, hp.n_gqa, axis=1), np.repeat(v, hp.n_gqa, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(dtype(hp.head_dim))
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p = f16(p / p.sum(-1, keepdims=True))
        x = x + np.einsum("hts,shd->thd", p, v).reshape(n, -1) @ deq(a.wo).T
        h = rms(x, layer.ffn_norm)
        g, u = h @ deq(layer.ffn.gate).T, h @ deq(layer.ffn.up).T
        x = x + (g / (1 + np.exp(-g)) * u) @ deq(layer.ffn.down).T
    out = rms(x, model.output_norm)
    hidden.append(out)
    return out @ deq(model.output).T, hidden


PROMPT = [5, 17, 42, 3, 88, 61, 29, 7, 50]


@pytest.mark.parametrize("name", ["llama-f32", "qwen3-f32"])
def test_forward_and_taps_match_float64_reference(models, name):
    """f32 weights, f32 cache: float32 rounding only, no further from the float64 reference than the same
    reference run in float32 is (float_reference.py)."""
    model = TargetModel(models[name], kv_type="f32")
    logits, features = model.forward(PROMPT, taps=[0, 1, 2])
    want_logits, hidden = reference_forward(model, PROMPT)
    logits32, hidden32 = reference_forward(model, PROMPT, np.float32)
    assert logits.shape == (len(PROMPT), VOCAB) and features.shape == (len(PROMPT), 3, EMBD)
    assert_within_reference_rounding(logits, logits32, want_logits, "logits")
    for i, j in enumerate([0, 1, 2]):
        assert_within_reference_rounding(features[:, i], hidden32[j], hidden[j], f"tap {j}")


def test_f16_cache_rounds_as_llama_cpp(models):
    """An f16 cache: q, k, v and the attention probabilities are rounded to f16. Against the float64 reference
    that rounds them at the same places, the logits differ by a small part of what those roundings move them
    (float32 differences flip an occasional f16 rounding: measured 0.2% on llama, 6% on qwen3; at most a
    quarter)."""
    for name in ("llama-f32", "qwen3-f32"):
        model = TargetModel(models[name])
        logits, _ = model.forward(PROMPT)
        plain, _ = reference_forward(model, PROMPT)
        rounded, _ = reference_forward(model, PROMPT, f16_cache=True)
        assert np.abs(logits - rounded).max() <= 0.25 * np.abs(rounded - plain).max(), name


def test_tap_of_the_last_layer_is_the_normed_output(models):
    model = TargetModel(models["llama-q8_0"])
    tokens = PROMPT[:4]
    _, features = model.forward(tokens, taps=[LAYERS, 0], logits="none")
    assert np.array_equal(features[:, 1], model.token_embd.rows(tokens))
    model.kv.clear()
    logits, _ = model.forward(tokens)
    assert np.array_equal(logits, model.output(features[:, 0]))


@pytest.mark.parametrize("name", ["llama-q8_0", "qwen3-q4_1", "llama-f16"])
def test_generation_after_crop_equals_never_going_further(models, name):
    model = TargetModel(models[name])
    straight, _ = greedy(model, PROMPT, 12)
    model.kv.clear()
    greedy(model, PROMPT, 20)
    assert model.kv.n_tokens == len(PROMPT) + 19
    model.kv.crop(len(PROMPT) + 5)            # keep the prompt and the first 6 generated tokens
    logits, _ = model.forward([straight[5]], logits="last")
    resumed = [int(np.argmax(logits[-1]))]
    while len(resumed) < 6:
        logits, _ = model.forward([resumed[-1]], logits="last")
        resumed.append(int(np.argmax(logits[-1])))
    assert resumed == straight[6:12]


@pytest.mark.parametrize("name", ["llama-q8_0", "qwen3-q4_1", "llama-f16", "qwen3-f32"])
def test_stepwise_batch_is_bit_identical_to_single_steps(models, name):
    model = TargetModel(models[name])
    model.forward(PROMPT[:3])
    batch_logits, batch_features = model.forward(PROMPT[3:], taps=[1], stepwise=True)
    model.kv.crop(3)
    for i, token in enumerate(PROMPT[3:]):
        logits, features = model.forward([token], taps=[1])
        assert np.array_equal(logits[0], batch_logits[i])
        assert np.array_equal(features[0], batch_features[i])


def test_split_model_loads_from_its_first_shard(models, tmp_path):
    write_model(tmp_path / "split.gguf", qtype=T.Q8_0, seed=2, split_max_tensors=8)
    shards = sorted(tmp_path.glob("split-*-of-*.gguf"))
    assert len(shards) > 1
    want, _ = TargetModel(models["llama-q8_0"]).forward(PROMPT)
    got, _ = TargetModel(shards[0]).forward(PROMPT)
    assert np.array_equal(got, want)


def test_forward_rejects_bad_input(models):
    model = TargetModel(models["llama-q8_0"])
    for ids in ([VOCAB], [-1], [0, VOCAB], [-1, 0], np.array([[VOCAB]])):   # one-token steps check apart
        with pytest.raises(ModelError, match="token id out of range"):
            model.forward(ids)
    assert model.kv.n_tokens == 0
    with pytest.raises(ValueError):
        model.forward([1, 2], positions=[3, 4])
    with pytest.raises(ValueError):
        model.forward([1], taps=[LAYERS + 1])
    with pytest.raises(ValueError):
        model.forward([])
    with pytest.raises(ValueError):
        model.kv.crop(1)


def test_unsupported_architecture_is_a_model_error(tmp_path):
    path = tmp_path / "gemma.gguf"
    w = GGUFWriter(str(path), "gemma3")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="gemma3"):
        TargetModel(path)
