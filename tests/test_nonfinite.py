"""Non-finite values are never hidden: quantize and requant-trunk refuse NaN/inf source values and NaN/inf
scales (naming the tensor and the first bad row) unless --allow-nonfinite, then warn with counts; convert
warns about NaN/inf in source tensors; the runtime stops a forward whose logits are not finite, naming the piece
and the tensor that made them. The bad values are put there by the tests, which is the truth checked."""

import json
import os
import shutil
import struct

import numpy as np
import pytest

from tests import gguf_builder as B
from tests.hostile_corpus import DEMO, F32, Q8_0, check_run, q8_blocks, whole_model


def ffn_kvs(n_ff: int, n_embd: int = 64) -> list:
    """The sample file's keys with the widths an ffn_up of [n_embd, n_ff] has (quantize and requant-trunk refuse a
    model whose tensor shapes disagree with its keys)."""
    kvs = [kv for kv in B.sample_kvs() if kv != B.kv_u32("llama.embedding_length", 64)]
    return kvs + [B.kv_u32("llama.embedding_length", n_embd), B.kv_u32("llama.feed_forward_length", n_ff)]


def test_quantize_refuses_nan_weights_naming_the_row(tmp_path):
    rows = np.random.default_rng(0).standard_normal((6, 64)).astype("<f4")
    rows[4, 17] = np.inf
    src = tmp_path / "src.gguf"
    src.write_bytes(whole_model([("blk.0.ffn_up.weight", [64, 6], F32, rows.tobytes())], ffn_kvs(6)))
    r = check_run(str(tmp_path), ["quantize", src, "-o", tmp_path / "q.gguf", "--scheme", "q4_0"], 2)
    assert "tensor 'blk.0.ffn_up.weight': row 4: NaN or inf values" in r.stderr
    r = check_run(str(tmp_path), ["quantize", src, "-o", tmp_path / "q.gguf", "--scheme", "q4_0", "--allow-nonfinite",
                                  "--json"], 0, [tmp_path / "q.gguf", tmp_path / "q.ggtools.json"])
    assert json.loads(r.stdout)["nonfinite"] == {str(tmp_path / "q.gguf"): {"blk.0.ffn_up.weight": 1}}


@pytest.mark.parametrize("width, bad_block, row, action", [(256, 9, 1, "NaN or inf values"),
                                                           (128, 5, 1, "refusing to copy them as verified")])
def test_requant_refuses_nan_scales(tmp_path, width, bad_block, row, action):
    """A Q8_0 block with a NaN scale, in a tensor that is converted (256 wide) or copied (128 wide)."""
    n_blocks = width // 32 * 4
    src = tmp_path / "src.gguf"
    src.write_bytes(whole_model([("blk.0.ffn_up.weight", [width, 4], Q8_0,
                                  q8_blocks(n_blocks, np.random.default_rng(1), bad_block))], ffn_kvs(4, width)))
    r = check_run(str(tmp_path), ["requant-trunk", src, "-o", tmp_path / "out", "-q"], 2)
    assert f"tensor 'blk.0.ffn_up.weight': row {row}: " in r.stderr and action in r.stderr
    out = [tmp_path / "out"]
    r = check_run(str(tmp_path), ["requant-trunk", src, "-o", tmp_path / "out", "-q", "--allow-nonfinite"], 0, out)
    assert "tensor 'blk.0.ffn_up.weight': " in r.stderr and "NaN/inf" in r.stderr


def test_convert_warns_about_nan_in_the_checkpoint(tmp_path):
    hf = shutil.copytree(os.path.join(DEMO, "drafter"), tmp_path / "hf")
    data = bytearray((hf / "model.safetensors").read_bytes())
    (n,) = struct.unpack_from("<Q", data)
    begin = json.loads(data[8:8 + n])["hidden_norm.weight"]["data_offsets"][0]
    data[8 + n + begin + 6:8 + n + begin + 8] = struct.pack("<H", 0x7FC0)           # BF16 NaN, element 3
    (hf / "model.safetensors").write_bytes(bytes(data))
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf")
    r = check_run(str(tmp_path), ["convert", "dflash", hf, "--target-gguf", target, "-o", tmp_path / "d.gguf", "-q"], 0,
                  [tmp_path / "d.gguf"])
    assert "NaN/inf values in source tensors" in r.stderr and "hidden_norm.weight (1 value)" in r.stderr


# ---- the runtime: non-finite logits stop a run, naming the piece and the tensor that made them -------------------

def _fill(src, dst, tensor, value) -> str:
    """A copy of an F32 model with every value of one tensor set to `value` (finite, but overflowing)."""
    from ggtools.gguf import GGUFFile
    data = bytearray(open(src, "rb").read())
    with GGUFFile(src) as f:
        t = f.tensor[tensor]
        assert t.type_name == "F32"
        start, n = t.data_start, t.nbytes
    data[start:start + n] = np.full(n // 4, value, "<f4").tobytes()
    with open(dst, "wb") as fh:
        fh.write(bytes(data))
    return str(dst)


@pytest.mark.parametrize("tensor, piece", [("blk.1.ffn_up.weight", "layer 1's feed-forward network"),
                                           ("blk.2.attn_k.weight", "layer 2's token mixer"),
                                           ("blk.3.attn_output.weight", "layer 3's token mixer"),
                                           ("token_embd.weight", "the token embedding")])
def test_target_nan_names_the_piece_and_the_tensor(tmp_path, tensor, piece):
    """The poisoned value is put there by the test; the error must name that tensor and the piece using it."""
    assert_forward_names_the_nan(os.path.join(DEMO, "target.gguf"), tmp_path, tensor, piece)


def assert_forward_names_the_nan(src, tmp_path, tensor, piece):
    """A forward of a copy of src with a NaN in `tensor` (hostile_corpus.poison) stops naming the tensor and the piece
    that uses it."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    model = TargetModel(poison(src, tmp_path / "m.gguf", tensor), threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([0, 1, 2])
    finally:
        model.close()
    assert f"tensor '{tensor}' holds NaN/inf" in str(e.value) and piece in str(e.value), str(e.value)


def test_nan_in_the_tied_head_is_caught(tmp_path):
    """A NaN in token_embd row 0, which the prompt never embeds: the tied head still computes logit 0 from it."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    path = poison(os.path.join(DEMO, "target.gguf"), tmp_path / "m.gguf", "token_embd.weight")   # row 0, value 40
    model = TargetModel(path, threads=1)
    try:
        logits, _ = model.forward([5, 6, 7], logits="last")
    except NonFiniteError as e:
        assert "tensor 'token_embd.weight'" in str(e) and "output norm and head" in str(e)
    else:
        pytest.fail(f"non-finite logits were returned: {logits[0, :3]}")
    finally:
        model.close()


def test_hybrid_target_nan_is_traced_after_rolling_back_the_recurrent_state(tmp_path):
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    from tests.tiny_targets import write_qwen35
    path = poison(write_qwen35(tmp_path / "q35.gguf"), tmp_path / "m.gguf", "blk.1.ssm_out.weight")
    model = TargetModel(path, threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3, 4])
    finally:
        model.close()
    assert "tensor 'blk.1.ssm_out.weight'" in str(e.value) and "layer 1's token mixer" in str(e.value)


def test_an_overflow_is_named_with_finite_tensors(tmp_path):
    """Finite weights whose products overflow float32: no tensor holds NaN/inf, the piece that overflowed is named."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.tiny_targets import write_gpt_oss
    path = _fill(write_gpt_oss(tmp_path / "oss.gguf"), tmp_path / "m.gguf", "blk.0.attn_output.weight", 3e38)
    model = TargetModel(path, threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3])
    finally:
        model.close()
    assert "layer 0's token mixer gives NaN/inf although its tensors are finite (an overflow)" in str(e.value)


def test_torch_backend_checks_what_comes_back(tmp_path):
    pytest.importorskip("torch")
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    path = poison(os.path.join(DEMO, "target.gguf"), tmp_path / "m.gguf", "blk.1.ffn_up.weight")
    model = TargetModel(path, threads=1, backend="torch", device="cpu")
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3])
    finally:
        model.close()
    assert "tensor 'blk.1.ffn_up.weight'" in str(e.value) and "layer 1's feed-forward network" in str(e.value)


def test_drafter_nan_is_named_and_accept_fails_it(tmp_path):
    """A NaN drafter never reports acceptance 0.0: drafting stops with the tensor's name (run --draft, accept)."""
    from tests.hostile_corpus import poison
    drafter = tmp_path / "d.gguf"
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf")
    from ggtools.jobs.convert import convert_dflash
    convert_dflash(os.path.join(DEMO, "drafter"), drafter, profile="llama.cpp", target=target)
    bad = poison(drafter, tmp_path / "nan.gguf", "blk.1.attn_q.weight")
    r = check_run(str(tmp_path), ["accept", "--target", target, "--draft", drafter, "--draft", bad, "-n", "6", "-q"], 2)
    assert "nan.gguf: tensor 'blk.1.attn_q.weight' holds NaN/inf" in r.stderr
    assert "the draft logits are not finite" in r.stderr


def test_a_forward_without_logits_checks_the_final_states(tmp_path):
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    model = TargetModel(poison(os.path.join(DEMO, "target.gguf"), tmp_path / "m.gguf", "blk.0.attn_v.weight"),
                        threads=1)
    try:
        with pytest.raises(NonFiniteError, match="tensor 'blk.0.attn_v.weight'.*final hidden states are not finite"):
            model.forward([1, 2, 3], taps=[1], logits="none")
    finally:
        model.close()


# the byte offset of a block's fp16 scale d (ggml-common.h block_q8_0, block_q4_1, block_q4_K, block_q6_K ...)
FP16_D = {"Q4_0": 0, "Q4_1": 0, "Q5_0": 0, "Q5_1": 0, "Q8_0": 0, "Q2_K": 80, "Q3_K": 108, "Q4_K": 0, "Q5_K": 0,
          "Q6_K": 208}


def nan_scale(src, dst, tensor) -> str:
    """A copy of src whose quantized tensor's block 0 has an fp16 scale d of NaN."""
    from gguf import GGML_QUANT_SIZES
    from ggtools.gguf import GGUFFile
    data = bytearray(open(src, "rb").read())
    with GGUFFile(src) as f:
        t = f.tensor[tensor]
        at = t.data_start + FP16_D[t.type_name]
        assert GGML_QUANT_SIZES[t.type_id][0] > 1
    data[at:at + 2] = np.float16(np.nan).tobytes()
    with open(dst, "wb") as fh:
        fh.write(bytes(data))
    return str(dst)


@pytest.mark.parametrize("scheme", ["q8_0", "q4_1", "q4_k", "q6_k"])
@pytest.mark.parametrize("tensor, piece", [("blk.3.attn_q.weight", "layer 3's token mixer"),
                                           ("blk.1.ffn_gate.weight", "layer 1's feed-forward network")])
def test_nan_scale_of_a_quantized_target_is_caught_and_named(tmp_path, scheme, tensor, piece):
    """A NaN scale in a quantized matrix: its rows' NaN reach the next quantized matmul (attn_output, ffn_down)
    through that matmul's input rounding to Q8_0, Q8_1 or Q8_K, which must keep it (rounded to an integer, NaN left
    the logits finite and wrong); the error names the tensor, the piece and the cause, as validate --deep does."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import run_cli
    quantized = tmp_path / f"{scheme}.gguf"
    assert run_cli(["quantize", os.path.join(DEMO, "target.gguf"), "-o", quantized, "--scheme", scheme]).exit_code == 0
    model = TargetModel(nan_scale(quantized, tmp_path / "m.gguf", tensor), threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([0, 1, 2])
    finally:
        model.close()
    assert (f"tensor '{tensor}' holds NaN/inf (first at block 0: a NaN/inf fp16 scale), so {piece} gives NaN/inf"
            in str(e.value)), str(e.value)


# ---- issue 39 (Trust III): every tensor a model reads is checked, and the cause is named ---------------------------

def spoiled(src, dst, tensor) -> str:
    """A copy of src with every value of an F32 / F16 / BF16 tensor NaN, or every block of an MXFP4 tensor's exponent
    0xFF."""
    from ggtools.gguf import GGUFFile
    from tests.hostile_corpus import mxfp4_scales_0xff
    with GGUFFile(src) as f:
        t = f.tensor[tensor]
        kind, start, n = t.type_name, t.data_start, t.nbytes
    if kind == "MXFP4":
        return mxfp4_scales_0xff(src, dst, tensor)
    nan = {"F32": np.float32(np.nan).tobytes(), "F16": np.float16(np.nan).tobytes(), "BF16": b"\xc0\x7f"}[kind]
    data = bytearray(open(src, "rb").read())
    data[start:start + n] = nan * (n // len(nan))
    with open(dst, "wb") as fh:
        fh.write(bytes(data))
    return str(dst)


def tiny_targets(d) -> dict:
    """A tiny target of each architecture written without an oracle (qwen3, qwen35, gpt-oss, qwen3moe with MXFP4
    experts)."""
    from tests.test_runtime_experts import write_moe
    from tests.tiny_targets import write_gpt_oss, write_qwen35
    return {"qwen3": os.path.join(DEMO, "target.gguf"), "qwen35": write_qwen35(d / "q35.gguf"),
            "gpt-oss": write_gpt_oss(d / "oss.gguf"), "qwen3moe": str(write_moe(d / "moe.gguf", 4, 64))}


def assert_every_tensor_read_is_named(path, tmp_path, tokens):
    """Every tensor the model's loaders read, spoiled whole in turn: the model refuses it as it loads it (a vector),
    or the forward stops naming it (never another tensor, never "an overflow")."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    model = TargetModel(path, threads=1)
    names = model.weights.read_names
    model.close()
    for name in names:
        try:
            model = TargetModel(spoiled(path, tmp_path / "x.gguf", name), threads=1)
            try:
                model.forward(tokens)
            finally:
                model.close()
        except NonFiniteError as e:
            assert f"tensor '{name}' holds NaN/inf" in str(e), (name, str(e))
        else:
            pytest.fail(f"{name}: NaN in it gave finite logits")


@pytest.mark.parametrize("arch", ["qwen3", "qwen35", "gpt-oss", "qwen3moe"])
def test_nan_in_any_tensor_a_target_reads_is_named(tmp_path, arch):
    assert_every_tensor_read_is_named(tiny_targets(tmp_path)[arch], tmp_path, [1, 2, 3, 4, 5])


@pytest.mark.parametrize("arch", ["qwen3", "qwen35", "gpt-oss", "qwen3moe"])
def test_every_tensor_a_target_reads_belongs_to_a_piece(tmp_path, arch):
    """The pieces the non-finite trace checks, with the tensors their loaders read: every tensor read is in one, and
    the pieces are the forward's, in its order."""
    from ggtools.runtime import TargetModel
    model = TargetModel(tiny_targets(tmp_path)[arch], threads=1)
    try:
        pieces, read = model.piece_tensors, model.weights.read_names
        layers = {(i, p): pieces[p] for i in range(model.hp.n_layer)
                  for p in (f"layer {i}'s token mixer", f"layer {i}'s feed-forward network")}
        assert list(pieces) == ["the token embedding", *(p for _, p in layers), "the output norm and head"]
        assert set().union(*pieces.values()) == set(read) and all(pieces.values())
        assert all(n.startswith(f"blk.{i}.") for (i, _), names in layers.items() for n in names
                   if n != "rope_freqs.weight")
    finally:
        model.close()


def test_mxfp4_exponent_0xff_is_named_as_the_cause(tmp_path):
    """MXFP4 experts whose E8M0 exponent bytes are 0xFF (E8M0's NaN; ggml decodes 2^127): the cause in
    validate --deep's words."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import mxfp4_scales_0xff
    path = mxfp4_scales_0xff(tiny_targets(tmp_path)["qwen3moe"], tmp_path / "m.gguf", "blk.0.ffn_down_exps.weight")
    model = TargetModel(path, threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3])
    finally:
        model.close()
    assert ("tensor 'blk.0.ffn_down_exps.weight' holds NaN/inf (first at block 0: MXFP4 exponent 0xFF), so layer 0's "
            "feed-forward network gives NaN/inf" in str(e.value)), str(e.value)


@pytest.mark.parametrize("arch, tensor", [("qwen3", "blk.3.attn_norm.weight"), ("qwen3", "output_norm.weight"),
                                          ("qwen35", "blk.0.ssm_a"), ("gpt-oss", "blk.1.attn_sinks.weight")])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_in_a_vector_is_refused_as_it_is_loaded(tmp_path, arch, tensor, value):
    """A norm, bias or scale is read whole at load: NaN/inf there is refused then, whether or not it would reach the
    logits (kimi-k3's exp_probs_b only picks experts; a sigmoid makes inf finite)."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    with pytest.raises(NonFiniteError, match=f"tensor '{tensor}' holds NaN/inf \\(first at value 1\\): the runtime "
                                             "refuses it as it loads it"):
        TargetModel(poison(tiny_targets(tmp_path)[arch], tmp_path / "m.gguf", tensor, value, index=1), threads=1)


@pytest.mark.oracle
@pytest.mark.parametrize("tensor, piece", [("blk.1.attn_res_score.weight", "layer 1"),
                                           ("output_res_score.weight", "the residual mix before the output norm")])
def test_kimi_k3_residual_scores_are_named(kimi_k3_target, tmp_path, tensor, piece):
    """kimi-k3's cross-layer residual attention (its score vectors mix the banked layer inputs): the trace runs the
    bank as the forward does, so a NaN score is named (it was "the output norm and head ... an overflow")."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    bad = poison(kimi_k3_target.gguf["f32"], tmp_path / "m.gguf", tensor)
    with pytest.raises(NonFiniteError) as e:
        TargetModel(bad, threads=1)
    assert f"tensor '{tensor}' holds NaN/inf (first at value 40)" in str(e.value), str(e.value)
    model = TargetModel(kimi_k3_target.gguf["f32"], threads=1)
    try:
        assert tensor in model.piece_tensors[piece]
    finally:
        model.close()


@pytest.mark.oracle
@pytest.mark.parametrize("layer", [1, 3, 5])
def test_kimi_k3_expert_with_mxfp4_exponent_0xff_is_named(kimi_k3_target, tmp_path, layer):
    """One routed expert's E8M0 exponents 0xFF, each expert in turn (Q8_0 trunk, MXFP4 experts): the trace runs the
    residual bank as the forward does, so it routes to the same experts; it ran the layers without the bank, routed
    elsewhere, found nothing and blamed the head ("the output norm and head gives NaN/inf although its tensors are
    finite (an overflow)": layer 3, expert 0). An expert no token routes to leaves the logits finite."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import mxfp4_scales_0xff
    tensor, named = f"blk.{layer}.ffn_down_exps.weight", 0
    for expert in range(8):
        model = TargetModel(mxfp4_scales_0xff(kimi_k3_target.gguf["q8_0"], tmp_path / "m.gguf", tensor, expert),
                            threads=1)
        try:
            model.forward([1, 2, 3, 4, 5, 6, 7, 8])
        except NonFiniteError as e:
            assert (f"tensor '{tensor}' holds NaN/inf (first at block {expert * 512}: MXFP4 exponent 0xFF), so layer "
                    f"{layer} gives NaN/inf" in str(e)), str(e)
            named += 1
        finally:
            model.close()
    assert named >= 6


@pytest.mark.oracle
def test_nan_in_any_tensor_kimi_k3_reads_is_named(kimi_k3_target, tmp_path):
    """The class test on kimi-k3 (KDA, MLA, latent MoE, residual bank), f32: every tensor it reads."""
    from ggtools.runtime import TargetModel
    model = TargetModel(kimi_k3_target.gguf["f32"], threads=1)
    try:
        assert set().union(*model.piece_tensors.values()) == set(model.weights.read_names)
        assert list(model.piece_tensors)[-2:] == ["the residual mix before the output norm", "the output norm and head"]
    finally:
        model.close()
    assert_every_tensor_read_is_named(kimi_k3_target.gguf["f32"], tmp_path, [1, 2, 3, 4, 5])


# ---- drafters: every tensor a drafter reads, and what decides its drafts (DFlash v1, DFlash2, DSpark) -------------

@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    """The demo target, and a drafter of each family for it: DFlash v1 (the demo drafter), DFlash2 (random, the
    hostile corpus's), DSpark (the demo's trained anchor-first drafter with a confidence head)."""
    from ggtools.jobs.convert import convert_dflash
    from tests.hostile_corpus import dflash2_drafter
    d = tmp_path_factory.mktemp("drafters")
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), d / "target.gguf")
    paths = {"dflash": d / "v1.gguf", "dspark": d / "dspark.gguf"}
    convert_dflash(os.path.join(DEMO, "drafter"), paths["dflash"], profile="llama.cpp", target=target)
    convert_dflash(os.path.join(DEMO, "dspark-anchor"), paths["dspark"], profile="llama.cpp", target=target)
    paths["dflash2"] = dflash2_drafter(d / "v2-hf", d / "v2.gguf", target)
    return str(target), {k: str(v) for k, v in paths.items()}


def _draft(target_path, drafter_path, settings=None):
    from ggtools.runtime import Drafter, DraftSettings, TargetModel
    from ggtools.runtime.speculative import speculative_generate
    target = TargetModel(target_path, threads=1)
    drafter = None
    try:
        drafter = Drafter(drafter_path, target)
        speculative_generate(target, drafter, drafter.new_kv(64), [1, 2, 3], 10, settings=settings or DraftSettings())
    finally:
        if drafter:
            drafter.close()
        target.close()


@pytest.mark.parametrize("family", ["dflash", "dflash2", "dspark"])
def test_nan_in_any_tensor_a_drafter_reads_is_named(drafters, tmp_path, family):
    """Every tensor the drafter's loaders read, spoiled whole in turn: refused as it is loaded (a vector), or the
    drafting stops naming it: the confidence head, DFlash2's selector and DSpark's Markov head included (a NaN
    confidence was never below --p-min; a NaN selector score or Markov bias picked a draft)."""
    from ggtools.runtime import Drafter, DraftSettings, TargetModel
    from ggtools.runtime.errors import NonFiniteError
    target_path, paths = drafters
    target = TargetModel(target_path, threads=1)
    drafter = Drafter(paths[family], target)
    names = drafter.weights.read_names
    drafter.close()
    target.close()
    settings = DraftSettings(cut="confidence", p_min=0.5) if family == "dspark" else None
    for name in names:
        if name == "d2t":
            continue                    # token ids, checked by the model-file rules
        try:
            _draft(target_path, spoiled(paths[family], tmp_path / "x.gguf", name), settings)
        except NonFiniteError as e:
            assert f"tensor '{name}' holds NaN/inf" in str(e), (name, str(e))
        else:
            pytest.fail(f"{name}: NaN in it gave finite drafts")


@pytest.mark.parametrize("tensor, value", [("conf_proj.weight", np.nan), ("conf_proj.weight", np.inf),
                                           ("conf_proj.bias", np.nan), ("conf_proj.bias", np.inf)])
def test_a_nonfinite_confidence_decides_no_cut(drafters, tmp_path, tensor, value):
    """llama.cpp's confidence cut (stop before the first draft whose confidence is below p_min): a NaN confidence is
    below nothing and sigmoid(+inf) = 1 is above everything, so such a head never cut; run and accept stop instead,
    naming the tensor (run exited 0, accept said pass)."""
    target, paths = drafters
    bad = poison_value(paths["dspark"], tmp_path / "bad.gguf", tensor, value)
    for args in (["run", "--target", target, "--draft", bad, "--prompt-ids", "1,2,3", "-n", "8"],
                 ["accept", "--target", target, "--draft", bad, "-n", "8", "-q"]):
        r = check_run(str(tmp_path), [*args, "--cut", "confidence", "--p-min", "0.5"], 2)
        assert f"bad.gguf: tensor '{tensor}' holds NaN/inf" in r.stderr, r.stderr


def poison_value(src, dst, tensor, value) -> str:
    """src with the first value of `tensor` set to value (hostile_corpus.poison at index 0)."""
    from tests.hostile_corpus import poison
    return poison(src, dst, tensor, value, index=0)


def test_an_inf_logit_is_caught_before_dflash2s_softcap(drafters, tmp_path):
    """DFlash2's softcap c * tanh(logit / c) turns a logit of +-inf into +-c: the head's logits are checked before it
    (an inf in the drafter's own head drafted its token at every row instead)."""
    from gguf import GGUFValueType as VT
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import _with_dspark_heads
    from tests.test_convert_support import rewrite_gguf
    target, paths = drafters
    head = np.random.default_rng(0).normal(0, 0.05, (2048, 128)).astype("<f4")
    head[5, 0] = np.inf                                     # logit 5 = inf * h_0 + finite: +inf or -inf
    capped = rewrite_gguf(paths["dflash2"], tmp_path / "capped.gguf",
                          set_keys=[("dflash.final_logit_softcapping", VT.FLOAT32, 30.0, None)])
    bad = _with_dspark_heads(str(capped), str(tmp_path / "bad.gguf"),
                             tensors=[("output.weight", [128, 2048], 0, head.tobytes())])
    with pytest.raises(NonFiniteError, match="tensor 'output.weight' holds NaN/inf .* the draft logits are not finite"):
        _draft(target, bad)
