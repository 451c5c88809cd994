"""Kimi K3 targets against their oracles. libllama 0.3.36 runs kimi-k3 (its vendored llama.cpp has
src/models/kimi-k3.cpp, and the tiny files load and decode), so the runtime is checked against llama.cpp itself
(llama-cpp-python, flash attention off, f16 KV cache) logit for logit and token for token on the tiny K3 files
llama.cpp's own converter made (F32, F16, the Q8_0 trunk + MXFP4 experts file, the plain variant) and on a Q4_K
trunk made by requant-trunk; the feature taps against a float64 reference written from the HF checkpoint's side
(tests/kimi_k3_reference.py); the KDA state's rollback against never having gone further.

Prompts are random id sequences whose llama.cpp greedy path keeps a clear top-1/top-2 margin (checked here and
printed with the logit differences), so that float-level differences could not decide a token.
"""

import shutil

import numpy as np
import pytest

from ggtools.runtime import TargetModel
from ggtools.runtime.errors import NonFiniteError
from ggtools.runtime.model.ffn import latent_moe
from ggtools.runtime.model.mixers import kda, mla
from tests.llama_runner import (LlamaCpp, assert_greedy_identical, assert_one_call_steps_identical,
                                assert_prompt_logits_identical, avx2_llama_cpp)
from tests.target_checks import assert_crop_equals_never_going_further, assert_run_refuses_patched

pytestmark = pytest.mark.oracle

N_GREEDY = 40
MIN_MARGIN = 0.01       # logits of the tiny K3 span about +-15; float-level differences are ~1e-5
PROMPT_SEEDS = [37, 56, 53, 15, 52]   # llama.cpp greedy margins >= 0.0189 in every encoding
ENCODINGS = ["f32", "f16", "q8_0", "plain-f32"]


def prompt(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1] + rng.integers(3, 1000, int(rng.integers(4, 40))).tolist()


class K3Oracle(LlamaCpp):
    def greedy(self, ids, n):
        self.llm.reset()     # a recurrent memory cannot keep a prefix of an earlier, longer sequence
        return super().greedy(ids, n)


@pytest.fixture(scope="module")
def llama_cpp():
    return avx2_llama_cpp()


@pytest.fixture(scope="module")
def files(kimi_k3_target, tmp_path_factory):
    """The converter's GGUFs, plus "q4_k": the Q8_0 file's trunk requantized to Q4_K by requant-trunk (columns not
    a multiple of 256 stay Q8_0, MXFP4 experts and F32 tensors byte-copied)."""
    from ggtools.jobs.requant import plan_requant_trunk, requant_trunk

    out = tmp_path_factory.mktemp("q4k")
    plan = plan_requant_trunk(str(kimi_k3_target.gguf["q8_0"]), str(out))
    requant_trunk(plan, jobs=1, progress=False)
    return dict(kimi_k3_target.gguf, q4_k=out / kimi_k3_target.gguf["q8_0"].name)


@pytest.fixture(scope="module")
def models(files):
    loaded = {}

    def get(encoding, kv_type="f16"):
        key = (encoding, kv_type)
        if key not in loaded:
            loaded[key] = TargetModel(files[encoding], threads=2, kv_type=kv_type)
        loaded[key].kv.clear()
        return loaded[key]

    yield get
    for model in loaded.values():
        model.close()


def test_libllama_loads_every_fixture(kimi_k3_target):
    """The oracle exists: libllama 0.3.36 loads each of the converter's kimi-k3 files (the fixture build records
    it; decoding is what the tests below do)."""
    loads = kimi_k3_target.manifest["loads"]
    assert all(loads[k]["ok"] for k in ENCODINGS), loads
    assert loads["q8_0"]["desc"] == "kimi-k3 ?B MXFP4 MoE"


def test_the_converters_files_break_no_model_file_rule(kimi_k3_target):
    """What libllama loads passes the model-file rules (kimi-k3's keys: hparam_rules/kimi_k3.py), so validate and
    doctor pass it and the runtime refuses none of it."""
    from ggtools.gguf import GGUFFile
    from ggtools.hparam_rules import model_violations

    for encoding in ENCODINGS:
        with GGUFFile(kimi_k3_target.gguf[encoding]) as f:
            assert model_violations(f) == [], encoding


def test_q8_0_fixture_has_the_field_reports_layout(kimi_k3_target):
    """The converter's q8_0 output of the MXFP4 checkpoint: routed experts MXFP4 (repacked from compressed-tensors,
    the same values as the bf16 checkpoint's: the F16 file's experts), the other matrices Q8_0 but the router,
    everything 1-D (norms, KDA scalars, scores, the selection bias) and the convolution taps F32."""
    from gguf import GGMLQuantizationType as T

    from ggtools import quants
    from ggtools.gguf import GGUFFile

    with GGUFFile(kimi_k3_target.gguf["q8_0"]) as q8, GGUFFile(kimi_k3_target.gguf["f16"]) as f16:
        halves = {t.name: t for t in f16.tensors}
        for t in q8.tensors:
            if "_exps" in t.name:
                assert t.type_id == T.MXFP4, t.name
                ref = halves[t.name]
                values = quants.dequantize(T.MXFP4, q8.tensor_data(t), t.row_length)
                assert np.array_equal(values, quants.dequantize(T.F16, f16.tensor_data(ref), ref.row_length)), t.name
            elif len([n for n in t.ne if n > 1]) < 2 or "ssm_conv1d" in t.name or "ffn_gate_inp" in t.name:
                assert t.type_id == T.F32, t.name
            else:
                assert t.type_id == T.Q8_0, t.name


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_prompt_logits_are_bit_identical(files, models, llama_cpp, encoding):
    oracle, model = K3Oracle(llama_cpp, files[encoding]), models(encoding)
    assert_prompt_logits_identical(oracle, model, [prompt(seed) for seed in PROMPT_SEEDS[:2]], f"kimi-k3 {encoding}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_one_call_steps_are_bit_identical(files, llama_cpp, monkeypatch, encoding, threads):
    """Each piece of a one-token step runs as one kernel call: the KDA (kda.one_token_kda), the MLA
    (mla.one_token_mla), the leading dense situ FFN (latent_moe.situ_ffn) and the latent MoE with its shared experts
    (latent_moe.one_token_latent_moe); the cross-layer residual mix around them stays as it is. On 2 threads their
    larger matmuls are shared with the worker from inside those calls."""
    path = files[encoding]
    oracle, model = K3Oracle(llama_cpp, path), TargetModel(path, threads=threads)
    kinds = [(type(layer.mixer).__name__, type(layer.ffn).__name__) for layer in model.layers]
    count = lambda name: sum(name in kind for kind in kinds)
    assert all(count(name) for name in ("KDA", "MLA", "SituFFN", "LatentMoE")), kinds
    assert_one_call_steps_identical(monkeypatch, oracle, model, prompt(PROMPT_SEEDS[0]), 6,
                                    [(kda, "one_token_kda", count("KDA")), (mla, "one_token_mla", count("MLA")),
                                     (latent_moe, "situ_ffn", count("SituFFN")),
                                     (latent_moe, "one_token_latent_moe", count("LatentMoE"))],
                                    f"kimi-k3 {encoding}, {threads} thread(s)", shared=threads > 1)
    model.close()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_greedy_tokens_are_identical(files, models, llama_cpp, encoding):
    oracle, model = K3Oracle(llama_cpp, files[encoding]), models(encoding)
    for seed in PROMPT_SEEDS:
        assert_greedy_identical(oracle, model, prompt(seed), N_GREEDY, MIN_MARGIN, f"kimi-k3 {encoding} seed {seed}")


def test_q4_k_trunk_stays_within_float_rounding_of_libllama(files, models, llama_cpp):
    """The requant-trunk'ed Q4_K trunk is not bit-exact: the runtime's K-quant dots that are not llama.cpp's own
    (kquant_dot.py reproduces its repacked Q4_K and its Q6_K; other K-quant matrices are within float rounding of
    its sums), and this model
    turns a last-bit difference into a jump now and then: a one-ulp change of the input embedding moves the
    logits of 2 of 64 single tokens by 1e-3 to 15.8 (an 8-bit input rounding that flips, an expert swapped by the
    sigmoid top-k). So the check is on single tokens: all but a few within 1e-4 of llama.cpp (measured: 60 of 64
    within 4.1e-6, 4 at 0.10-0.54; since the integer Q4_K / Q6_K dots 64 of 64, within 3.8e-6); a wrong Q4_K decode or kernel would move every one. Greedy paths over 40
    tokens agree with llama.cpp's until such a jump (measured: median 11 tokens, 7 of 60 prompts all 40)."""
    oracle, model = K3Oracle(llama_cpp, files["q4_k"]), models("q4_k")
    diffs = []
    for token in range(3, 67):
        model.kv.clear()
        diffs.append(float(np.abs(model.forward([token])[0] - oracle.prompt_logits([token])).max()))
    close = sum(d <= 1e-4 for d in diffs)
    print(f"kimi-k3 q4_k: {close} of {len(diffs)} single tokens within 1e-4 (max of those "
          f"{max(d for d in diffs if d <= 1e-4):.1e}), the others {sorted(d for d in diffs if d > 1e-4)}")
    assert close >= 56


@pytest.mark.parametrize("encoding, hf", [("f32", "tiny-kimi-k3"), ("plain-f32", "tiny-kimi-k3-plain")])
def test_feature_taps_are_the_layer_inputs(kimi_k3_target, models, encoding, hf):
    """Tap j < n_layer is the residual stream entering layer j (inpL at the top of llama.cpp's layer loop, where
    the field report's llama.cpp patch sets t_layer_inp; with residual attention the stream restarts at each
    block, so it is not a sum of all earlier outputs), tap n_layer the final normed state: against the float64
    reference from the HF checkpoint, f32 GGUF and f32 cache (float rounding, measured 3e-6 relative)."""
    from tests.kimi_k3_reference import KimiK3Reference

    reference = KimiK3Reference(kimi_k3_target.hf_dir.parent / hf)
    ids = [1] + np.random.default_rng(1).integers(3, 1024, 30).tolist()
    hidden, ref_logits = reference.forward(ids)
    model = models(encoding, kv_type="f32")
    taps = list(range(model.hp.n_layer + 1))
    logits, features = model.forward(ids, taps=taps)
    for j in taps:
        err = np.abs(features[:, j] - hidden[j]).max() / np.abs(hidden[j]).max()
        print(f"{encoding} tap {j}: max relative difference {err:.1e}")
        assert err <= 2e-5, j
    assert np.abs(logits - ref_logits).max() / np.abs(ref_logits).max() <= 2e-5


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_crop_then_generate_equals_never_going_further(models, encoding):
    """Crop back into the generated tokens and into the prompt (the KDA states roll back with the latent cache),
    then go on: the same logits, bit for bit, as a fresh run that made the same calls up to there."""
    assert_crop_equals_never_going_further(models(encoding), prompt(PROMPT_SEEDS[0]))


@pytest.mark.parametrize("encoding", ["f16", "q8_0"])
def test_stepwise_batch_equals_one_token_steps(models, encoding):
    """A verify batch with stepwise=True gives the bits of feeding its tokens one at a time (what speculative
    decoding needs to reproduce greedy decoding exactly)."""
    model = models(encoding)
    ids = prompt(PROMPT_SEEDS[1])
    model.forward(ids, logits="none")
    batch, _ = model.forward([11, 12, 13, 14, 15], stepwise=True)
    model.kv.crop(len(ids))
    steps = np.concatenate([model.forward([t])[0] for t in (11, 12, 13, 14, 15)])
    assert np.array_equal(batch, steps)


def test_unrouted_experts_are_never_read(files, tmp_path):
    """The Q8_0 + MXFP4 file with every expert no token routes to overwritten with 0xFF (scales of 2^127): the
    same logits bit for bit; with a routed one overwritten too, the step stops with an error naming a poisoned expert
    tensor (its layer's output, or a later layer routed onto poisoned experts, is not finite)."""
    from ggtools.runtime.model.ffn.latent_moe import LatentMoE

    model = TargetModel(files["q8_0"], threads=2)
    seen = {}
    route = LatentMoE.route

    def recording(ffn, h, stepwise, logits=None):
        experts, weights = route(ffn, h, stepwise, logits)
        seen.setdefault(id(ffn), set()).update(experts.reshape(-1).tolist())
        return experts, weights

    ids = prompt(PROMPT_SEEDS[2])[:6]
    LatentMoE.route = recording
    try:
        want, _ = model.forward(ids)
    finally:
        LatentMoE.route = route
    moe = [layer.ffn for layer in model.layers if isinstance(layer.ffn, LatentMoE)]
    assert all(0 < len(seen[id(f)]) < f.n_expert for f in moe)
    garbage = shutil.copyfile(files["q8_0"], tmp_path / "garbage.gguf")

    def poison(ffn, experts):
        with open(garbage, "r+b") as f:
            for m in (ffn.gate, ffn.up, ffn.down):
                per_expert = m.data.size // m.n_expert
                for e in experts:
                    f.seek(m.offset + e * per_expert)
                    f.write(b"\xff" * per_expert)

    for ffn in moe:
        poison(ffn, sorted(set(range(ffn.n_expert)) - seen[id(ffn)]))
    got, _ = TargetModel(garbage, threads=2).forward(ids)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    poison(moe[0], sorted(seen[id(moe[0])])[:1])
    with pytest.raises(NonFiniteError, match=r"'blk\.\d+\.ffn_\w+_exps\.weight' holds NaN/inf"):
        TargetModel(garbage, threads=2).forward(ids)


def test_kv_b_instead_of_k_b_v_b_is_split_at_load(files, models, tmp_path):
    """A K3 file whose MLA layers hold attn_kv_b (kv_b_proj unsplit) instead of attn_k_b / attn_v_b: the runtime
    splits it as llama.cpp's converter does, so the F32 file rewritten that way gives the same logits bit for bit.
    (llama.cpp's own graph cannot run such a file: with key_length_mla set its kv_b branch has no KV input.)"""
    import gguf

    reader = gguf.GGUFReader(files["f32"])
    writer = gguf.GGUFWriter(str(tmp_path / "kv_b.gguf"), "kimi-k3")
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    tensors = {t.name: t for t in reader.tensors}
    for t in reader.tensors:
        if t.name.endswith("attn_k_b.weight"):
            # k_b (n_head, kv_lora, nope), v_b (n_head, v, kv_lora)
            k_b, v_b = t.data, tensors[t.name.replace("k_b", "v_b")].data
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)     # (n_head, nope + v, kv_lora)
            writer.add_tensor(t.name.replace("attn_k_b", "attn_kv_b"), kv_b.reshape(-1, kv_b.shape[-1]))
        elif not t.name.endswith("attn_v_b.weight"):
            writer.add_tensor(t.name, t.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = prompt(PROMPT_SEEDS[0])
    merged = TargetModel(tmp_path / "kv_b.gguf", threads=2)
    assert not merged.weights.has("blk.2.attn_k_b.weight") and merged.weights.has("blk.2.attn_kv_b.weight")
    assert np.array_equal(merged.forward(ids)[0], models("f32").forward(ids)[0])


@pytest.mark.parametrize("edit, message", [
    ("kimi-k3.attention.head_count_kv=i32[]:0,0,2,0,0,1", "'kimi-k3.attention.head_count_kv': holds [2]: a kimi-k3 layer has 0 KV heads (KDA) or 1"),
    ("kimi-k3.attention.head_count_kv=i32[]:0,1", "'kimi-k3.attention.head_count_kv': has 2 entries for 6 layers"),
    ("kimi-k3.expert_gating_func=u32:1", "'kimi-k3.expert_gating_func': is 1: kimi-k3 routes its experts by sigmoid (2"),
    ("kimi-k3.attention.key_length=u32:100", "'kimi-k3.attention.key_length': is 100: kimi-k3's MLA cache holds kv_lora_rank + "
                                                "rope.dimension_count"),
    ("kimi-k3.activation.situ_beta=f32:0", "'kimi-k3.activation.situ_beta': is 0: situ divides the gate by it"),
    ("kimi-k3.expert_used_count=u32:9", "'kimi-k3.expert_used_count': is 9, above expert_count 8"),
])
def test_inconsistent_k3_keys_are_one_line_errors(files, tmp_path, edit, message):
    """A K3 GGUF whose keys contradict each other (the model-file rules, hparam_rules/kimi_k3.py): `ggtools run`
    names the file and the rule in one line and exits 2, no traceback; the input is not modified."""
    assert_run_refuses_patched(files["q8_0"], edit, message, tmp_path)
